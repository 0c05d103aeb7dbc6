package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

const rootLong = `pgfence is the operator's tool for pgfence, mutual exclusion on PostgreSQL:
apply its schema, run a command under a lease or an advisory lock, inspect and
break locks, and watch the demo.

Connection: --database-url, else the DATABASE_URL environment variable, else
libpq's PG* variables (PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD,
PGSSLMODE, PGSERVICE, ...). URL and keyword/value forms are accepted.

Exit codes:
  0    success
  1    error (the message on stderr says what to do)
  2    usage: unknown command or flag, missing or invalid argument
  3    demo: the exactly-once check failed
  4    check: found something (long holds or waits, stuck takeovers, unguarded tables)
  69   the database is unreachable (EX_UNAVAILABLE), or stopped answering
  75   run --no-wait: the lease or lock is held by someone else (EX_TEMPFAIL)
  126  run: the command could not be executed
  127  run: the command was not found
  run otherwise exits with its command's status (128+N when the command
  died of signal N; 1 when it exited 0 after the lease or lock was lost),
  or 128+N when run itself was interrupted by signal N before the command
  started.`

// execute runs the command line args and returns the process exit code.
func execute(args []string) int {
	root := newRootCmd()
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		// Every RunE wraps its errors (see action), so an untyped error
		// comes from cobra itself: an unknown command, flag or argument.
		ee = &exitError{code: exitUsage, err: err, usage: true}
	}
	if ee.err != nil {
		fmt.Fprintf(root.ErrOrStderr(), "pgfence: %v\n", ee.err)
	}
	if ee.usage && cmd != nil {
		fmt.Fprintf(root.ErrOrStderr(), "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return ee.code
}

// globals are the flags every command shares.
type globals struct {
	databaseURL string
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "pgfence",
		Short:         "Mutual exclusion on PostgreSQL: leases, advisory locks, fencing",
		Long:          rootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
		// A bare "pgfence" prints help and exits 0; an unknown
		// subcommand is a usage error.
		Args: argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error { return cmd.Help() }),
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetErr(&redactWriter{w: os.Stderr, secrets: func() []string { return connSecrets(root) }})
	root.PersistentFlags().StringVar(&g.databaseURL, "database-url", "",
		"PostgreSQL connection string (default: $DATABASE_URL, else libpq PG* variables)")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError(err)
	})
	root.AddCommand(
		newMigrateCmd(g),
		newRunCmd(g),
		newLeasesCmd(g),
		newLocksCmd(g),
		newDemoCmd(g),
		newBenchCmd(g),
		newFenceCmd(g),
		newCheckCmd(g),
		newVersionCmd(),
		newCompletionCmd(),
		newReaperCmd(),
	)
	return root
}
