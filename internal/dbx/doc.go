// Package dbx is the seam between pgfence's packages and database/sql. The
// packages speak pgx: QueryRow, Query and Exec with pgx's signatures, which
// *pgxpool.Pool has already. SQL turns a *sql.DB, *sql.Conn or *sql.Tx into
// the same Querier, so that one body of code serves both, with the pgx path
// unchanged (the pool is used as is, with no adapter in between).
//
// What the adapter does on the way, so that the callers need not know which
// driver answers (pgx's stdlib driver or lib/pq):
//
//   - arguments: Go slices ([]string, []int64, []int32), which lib/pq cannot
//     bind, are sent as PostgreSQL array literals, quoted in Go; the
//     statements read them as text[], int8[] or int4[] (a cast or the
//     function's signature);
//   - scanning: a nil destination discards its column, as in pgx; a
//     *json.RawMessage takes NULL (as nil); sql.ErrNoRows becomes
//     pgx.ErrNoRows;
//   - errors: a driver error carrying a SQLSTATE (interface{ SQLState()
//     string }, which *pq.Error and *pgconn.PgError both have) also answers
//     errors.As with a *pgconn.PgError, so that the packages read every
//     SQLSTATE one way. The driver's error stays in the chain.
package dbx
