package pgfencetest_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/pgfencetest"
)

// query runs SELECT 1 on a new connection to u within d.
func query(u string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

func TestProxyCutAndRestore(t *testing.T) {
	t.Parallel()
	cutAndRestore(t, pgfencetest.URL(t))
}

// TestProxyURLKeywordValue: a connection string in keyword/value form,
// which PGFENCE_TEST_DATABASE_URL may hold and URL then returns, goes
// through the proxy too.
func TestProxyURLKeywordValue(t *testing.T) {
	t.Parallel()
	pu, err := url.Parse(pgfencetest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	kv := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable",
		pu.Hostname(), pu.Port(), pu.User.Username(), strings.TrimPrefix(pu.Path, "/"))
	if pw, ok := pu.User.Password(); ok { // a server the tests share may ask for one
		kv += " password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "'"
	}
	cutAndRestore(t, kv)
}

// TestProxyURLHostParameter: a URL whose parameters name the host and
// port, which pgx prefers to the URL's, goes through the proxy too.
func TestProxyURLHostParameter(t *testing.T) {
	t.Parallel()
	pu, err := url.Parse(pgfencetest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := pu.Query()
	q.Set("host", pu.Hostname())
	q.Set("port", pu.Port())
	pu.RawQuery = q.Encode()
	cutAndRestore(t, pu.String())
}

// cutAndRestore checks that a connection made with ProxyURL's rewrite of
// databaseURL is cut by Cut, that no new one gets through while cut, and
// that connecting works again after Restore.
func cutAndRestore(t *testing.T, databaseURL string) {
	t.Helper()
	ctx := context.Background()
	proxy, u := pgfencetest.ProxyURL(t, databaseURL)
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	proxy.Cut()
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("a connection through a cut proxy still works: it does not go through the proxy")
	}
	if err := query(u, 5*time.Second); err == nil {
		t.Fatal("a new connection through a cut proxy works")
	}
	proxy.Restore()
	if err := query(u, 10*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
}

// startPostgres starts a PostgreSQL container of the test's own.
func startPostgres(t *testing.T) (*tcpostgres.PostgresContainer, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := pgtest.DockerAvailable(ctx); err != nil {
		t.Fatalf("the container fault tests need a Docker engine: %v", err)
	}
	ctr, err := tcpostgres.Run(ctx, pgtest.ContainerImage(), tcpostgres.BasicWaitStrategies())
	if ctr != nil {
		t.Cleanup(func() {
			if err := testcontainers.TerminateContainer(ctr); err != nil {
				t.Errorf("terminate: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("start %s (set %s): %v", pgtest.ContainerImage(), pgfencetest.EnvImage, err)
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	return ctr, u
}

func TestPauseContainer(t *testing.T) {
	t.Parallel()
	ctr, u := startPostgres(t)
	resume := pgfencetest.PauseContainer(t, ctr.GetContainerID())
	if err := query(u, 2*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("query on a paused server: %v, want a timeout", err)
	}
	resume()
	resume() // safe to repeat
	if err := query(u, 30*time.Second); err != nil {
		t.Fatalf("after resume: %v", err)
	}
}

func TestCutContainerNetwork(t *testing.T) {
	t.Parallel()
	ctr, u := startPostgres(t)
	restore := pgfencetest.CutContainerNetwork(t, ctr.GetContainerID())
	if err := query(u, 2*time.Second); err == nil {
		t.Fatal("a server cut off from its network answers")
	}
	restore()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The published port may change when the container rejoins.
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	if err := query(u, 30*time.Second); err != nil {
		t.Fatalf("after restore: %v", err)
	}
}
