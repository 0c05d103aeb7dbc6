package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// What the command prints on stderr while it runs (a lost lease's cause,
// a force-release's retry) is redacted as its final error is: pgx's own
// redaction of a connection string is best effort.
func TestStderrIsRedacted(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://pgfence_nobody:Gk7@Wq3z@127.0.0.1:1/nowhere")
	root := newRootCmd()
	w, ok := root.ErrOrStderr().(*redactWriter)
	if !ok {
		t.Fatalf("the root command's stderr is %T, want a *redactWriter", root.ErrOrStderr())
	}
	var buf bytes.Buffer
	w.w = &buf
	run, _, err := root.Find([]string{"run"})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(run.ErrOrStderr(), "pgfence: lease lost: hostname resolving error: lookup Wq3z@127.0.0.1: no such host\n")
	if got := buf.String(); strings.Contains(got, "Wq3") || !strings.Contains(got, "lookup") {
		t.Errorf("stderr = %q, want the message with the password's pieces masked", got)
	}
}
