package pglock

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// Info describes one session holding or awaiting an advisory lock, or a
// prepared transaction holding one, as pg_locks, pg_stat_activity and
// pg_prepared_xacts show it. Times are the database server's clock.
//
// PostgreSQL records neither the name of a lock (only its key: Key cannot
// be reversed) nor when it was granted. What bounds a holder's age:
// BackendStart (the lock is no older than its session) and, for an idle
// holder, StateChange (held at least since then; pglock's liveness check
// renews it about every second).
type Info struct {
	Key     int64 // Key(name) for pglock's locks
	Shared  bool  // held or awaited in shared mode (RLock)
	Granted bool  // held; false: waiting for it

	// The session: its backend pid, application_name and client address
	// ("" for a Unix socket, or when the role may not see it:
	// pg_read_all_stats), its state (idle, active, ...).
	PID             int32
	ApplicationName string
	ClientAddr      string
	State           string

	BackendStart time.Time // when the session started; zero if not visible
	StateChange  time.Time // its last state change; zero if not visible
	WaitStart    time.Time // a waiter's wait start (PostgreSQL 14+); zero for holders
	ReadAt       time.Time // when the row was read: ages are ReadAt minus the times above

	// A prepared transaction (PREPARE TRANSACTION) holds its transaction
	// locks with no session: PID 0, GID naming it and Prepared when it was
	// prepared. Only COMMIT PREPARED or ROLLBACK PREPARED releases them;
	// ending a session does not.
	GID      string
	Prepared time.Time
}

// infoJSON is Info as sqlLockRows' columns, for the rows a failed try
// returns as JSON.
type infoJSON struct {
	Key             int64      `json:"key"`
	Shared          bool       `json:"shared"`
	Granted         bool       `json:"granted"`
	PID             int32      `json:"pid"`
	ApplicationName string     `json:"application_name"`
	ClientAddr      string     `json:"client_addr"`
	State           string     `json:"state"`
	BackendStart    *time.Time `json:"backend_start"`
	StateChange     *time.Time `json:"state_change"`
	WaitStart       *time.Time `json:"wait_start"`
	ReadAt          time.Time  `json:"read_at"`
	GID             string     `json:"gid"`
	Prepared        *time.Time `json:"prepared"`
}

func (j infoJSON) info() Info {
	return Info{
		Key: j.Key, Shared: j.Shared, Granted: j.Granted, PID: j.PID,
		ApplicationName: j.ApplicationName, ClientAddr: j.ClientAddr, State: j.State,
		BackendStart: orZero(j.BackendStart), StateChange: orZero(j.StateChange),
		WaitStart: orZero(j.WaitStart), ReadAt: j.ReadAt,
		GID: j.GID, Prepared: orZero(j.Prepared),
	}
}

func orZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// decodeHolders reads the JSON array of holders a failed try returns.
func decodeHolders(raw []byte) []Info {
	var rows []infoJSON
	if len(raw) == 0 || json.Unmarshal(raw, &rows) != nil {
		return nil // the holders are a courtesy; the refusal stands
	}
	out := make([]Info, len(rows))
	for i, r := range rows {
		out[i] = r.info()
	}
	return out
}

// List returns every session holding or awaiting an advisory lock, and
// every prepared transaction holding one, in the pool's database
// (single-bigint keys, as pglock takes them), ordered by
// key, holders before waiters, waiters by wait start. Sessions of any
// client count, not only this Locker's. ctx bounds the one query. It
// needs no pgfence schema and no privilege beyond connecting; without
// pg_read_all_stats, other roles' sessions show no client address or
// state.
func (l *Locker) List(ctx context.Context) ([]Info, error) {
	if l == nil {
		return nil, invalid("locker", "is nil")
	}
	if ctx == nil {
		return nil, invalid("context", "is nil")
	}
	return l.list(ctx, "list", nil)
}

// Get returns the sessions holding or awaiting the lock name, as List
// does; an empty slice when there are none.
func (l *Locker) Get(ctx context.Context, name string) ([]Info, error) {
	if l == nil {
		return nil, invalid("locker", "is nil")
	}
	if err := checkCall(ctx, name); err != nil {
		return nil, err
	}
	key := Key(name)
	return l.list(ctx, fmt.Sprintf("get %q", name), &key)
}

func (l *Locker) list(ctx context.Context, op string, key *int64) ([]Info, error) {
	rows, err := l.q.Query(ctx, sqlList, key)
	if err != nil {
		return nil, fmt.Errorf("pglock: %s: %w", op, pgerr.WithHint(err))
	}
	infos, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Info, error) {
		var i Info
		var backendStart, stateChange, waitStart, prepared *time.Time
		err := row.Scan(&i.Key, &i.Shared, &i.Granted, &i.PID, &i.ApplicationName, &i.ClientAddr, &i.State,
			&backendStart, &stateChange, &waitStart, &i.ReadAt, &i.GID, &prepared)
		i.BackendStart, i.StateChange, i.WaitStart = orZero(backendStart), orZero(stateChange), orZero(waitStart)
		i.Prepared = orZero(prepared)
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("pglock: %s: %w", op, pgerr.WithHint(err))
	}
	if infos == nil {
		infos = []Info{}
	}
	return infos, nil
}
