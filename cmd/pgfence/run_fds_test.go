package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The command gets the descriptors pgfence was started with, under their
// numbers, as it would without pgfence in between: a script's `3>log` or
// a lock file's descriptor passed on (fds 3 and 5 here), and no
// descriptor of pgfence's own (fd 4 was not passed and stays closed).
func TestRunPassesInheritedDescriptors(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	for _, grant := range [][]string{{"--lease", "fds", "--ttl", "10s"}, {"--lock", "fds"}} {
		t.Run(grant[0][2:], func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			three, err := os.Create(filepath.Join(dir, "three"))
			if err != nil {
				t.Fatal(err)
			}
			defer three.Close()
			five, err := os.Create(filepath.Join(dir, "five"))
			if err != nil {
				t.Fatal(err)
			}
			defer five.Close()
			ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
			defer cancel()
			args := append(append([]string{"--database-url", url, "run"}, grant...), "--", "sh", "-c",
				`echo to3 >&3 && echo to5 >&5 && if { true >&4; } 2>/dev/null; then echo "fd 4 is open"; fi`)
			cmd := cliCommand(ctx, t, cliEnv(), args...)
			cmd.ExtraFiles = []*os.File{three, nil, five} // fds 3, 4 (closed), 5
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err = cmd.Run()
			if err != nil {
				t.Fatalf("pgfence run: %v; stdout %q, stderr %q", err, stdout.String(), stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("the command wrote %q: it was given a descriptor pgfence was not", stdout.String())
			}
			for name, want := range map[string]string{"three": "to3\n", "five": "to5\n"} {
				got, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != want {
					t.Errorf("the file passed as fd %s holds %q, want %q", name, got, want)
				}
			}
		})
	}
}
