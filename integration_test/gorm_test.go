package integration_test

import (
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
)

// Example_gorm's fenced write, run: GORM's transaction declaring the token
// first is checked by the guard like fencing.InDBTx.
func TestGORMFencedWrite(t *testing.T) {
	t.Parallel()
	u := setup(t)
	admin := newPool(t, u, "admin")
	ctx := ctxT(t, time.Minute)
	protectedTable(t, admin, "accounts", "id int PRIMARY KEY, balance int NOT NULL")
	gdb, err := gorm.Open(postgres.Open(u), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("gorm.Open: %v", err)
	}
	db, err := gdb.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	c, err := leases.NewDB(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	write := func(tok fencing.Token, balance int) error {
		return gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("CALL pgfence.declare(?, ?)", tok.Lease, tok.Fence).Error; err != nil {
				return err
			}
			return tx.Exec("INSERT INTO accounts (id, balance) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance", balance).Error
		})
	}
	l1, err := c.TryAcquire(ctx, "acct", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(l1.Token(), 100); err != nil {
		t.Fatalf("fenced write: %v", err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := c.TryAcquire(ctx, "acct", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(l2.Token(), 200); err != nil {
		t.Fatalf("fenced write with the new token: %v", err)
	}
	if err := write(l1.Token(), 300); !fencing.IsStale(err) {
		t.Fatalf("write with the stale token: %v, want IsStale", err)
	}
	if err := gdb.Exec("UPDATE accounts SET balance = 0").Error; !fencing.IsNoToken(err) {
		t.Fatalf("write declaring no token: %v, want IsNoToken", err)
	}
	var balance int
	if err := admin.QueryRow(ctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&balance); err != nil || balance != 200 {
		t.Fatalf("balance %d (%v), want 200", balance, err)
	}
}
