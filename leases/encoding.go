package leases

import (
	"context"
	"fmt"

	"github.com/pgfence/pgfence/internal/names"
)

// sqlClientEncoding reads the session's client_encoding.
const sqlClientEncoding = `SELECT pg_catalog.current_setting('client_encoding')`

// checkEncoding refuses name, the subject of op ("acquire"), when it is not ASCII and the sessions'
// client_encoding is not UTF8 (a role's or database's default, say
// LATIN1): the server would read Go's UTF-8 bytes as text in that
// encoding and store another name — "café" as "cafÃ©" — so that a client
// whose sessions are UTF8 could hold "the same" lease at once. An ASCII
// name is the same text in every client encoding. The encoding is read
// once per Client, on its first name that is not ASCII, and again while
// it is not UTF8: the sessions of one pool share their role's and
// database's settings.
func (c *Client) checkEncoding(ctx context.Context, op, name string) error {
	if names.ASCII(name) || c.utf8.Load() {
		return nil
	}
	var enc string
	if err := c.q.QueryRow(ctx, sqlClientEncoding).Scan(&enc); err != nil {
		return dbError(fmt.Sprintf("%s %q: read client_encoding", op, name), err)
	}
	if enc == "UTF8" {
		c.utf8.Store(true)
		return nil
	}
	return invalid(fmt.Sprintf("leases: %s %q: the name is not ASCII and the session's client_encoding is %s, "+
		"which stores it as another name: connect with client_encoding=UTF8", op, name, enc))
}
