//go:build linux

package integration_test

import (
	"testing"
	"time"
)

func TestPatroniSmoke(t *testing.T) {
	p := startPatroni(t)
	ctx := ctxT(t, time.Minute)
	for _, u := range []string{p.URL("postgres"), p.HAProxyURL("postgres")} {
		c := haConn(t, u)
		var rec bool
		if err := c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil || rec {
			t.Fatalf("%s: in recovery %v, %v", u, rec, err)
		}
	}
}
