package leases

import (
	"context"
	"fmt"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/names"
)

// sqlClientEncoding reads the session's client_encoding.
const sqlClientEncoding = `SELECT pg_catalog.current_setting('client_encoding')`

// checkEncoding refuses name, the subject of op ("acquire"), when it or
// one of more (a period key, data) is not ASCII and the sessions'
// client_encoding is not UTF8 (a role's or database's default, say
// LATIN1): the server would read Go's UTF-8 bytes as text in that encoding
// and store, or look for, other text — "café" as "cafÃ©" — so that a
// client whose sessions are UTF8 could hold "the same" lease at once, or
// run "the same" period again. ASCII is the same text in every client
// encoding. The encoding is read once per Client, on its first text that
// is not ASCII, and again while it is not UTF8: the sessions of one pool
// share their role's and database's settings.
func (c *Client) checkEncoding(ctx context.Context, op, name string, more ...string) error {
	if c.utf8.Load() || allASCII(name, more) {
		return nil
	}
	enc, err := clientEncoding(ctx, c.q, op, name)
	if err != nil {
		return err
	}
	if enc == "UTF8" {
		c.utf8.Store(true)
		return nil
	}
	return notUTF8(op, name, enc)
}

// checkTxEncoding is checkEncoding on a transaction of the caller's
// (MarkDone), which no Client has read the encoding of.
func checkTxEncoding(ctx context.Context, tx dbx.Querier, op, name string, more ...string) error {
	if allASCII(name, more) {
		return nil
	}
	enc, err := clientEncoding(ctx, tx, op, name)
	if err != nil || enc == "UTF8" {
		return err
	}
	return notUTF8(op, name, enc)
}

func allASCII(name string, more []string) bool {
	if !names.ASCII(name) {
		return false
	}
	for _, s := range more {
		if !names.ASCII(s) {
			return false
		}
	}
	return true
}

func clientEncoding(ctx context.Context, q dbx.Querier, op, name string) (string, error) {
	var enc string
	if err := q.QueryRow(ctx, sqlClientEncoding).Scan(&enc); err != nil {
		return "", dbError(fmt.Sprintf("%s %q: read client_encoding", op, name), err)
	}
	return enc, nil
}

func notUTF8(op, name, enc string) error {
	return invalid(fmt.Sprintf("leases: %s %q: text that is not ASCII over a session whose client_encoding is %s "+
		"is stored and looked up as other text: connect with client_encoding=UTF8", op, name, enc))
}
