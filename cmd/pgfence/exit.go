package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

// Exit codes; documented in rootLong.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitCheckFailed = 3
	exitFindings    = 4   // check: leases held or lock waits longer than the threshold
	exitUnavailable = 69  // sysexits EX_UNAVAILABLE
	exitHeld        = 75  // sysexits EX_TEMPFAIL
	exitCannotExec  = 126 // as POSIX shells and env(1)
	exitNotFound    = 127
)

// exitError carries the process exit code for err. A nil err exits
// silently with code (run uses it to pass on its child's status).
type exitError struct {
	code int
	err  error
	// usage marks a usage error (exit 2): execute points to --help. Only
	// these: a command run passes on may exit 2 too.
	usage bool
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageErrorf is a usage error (exit 2).
func usageErrorf(format string, args ...any) error {
	return usageError(fmt.Errorf(format, args...))
}

// usageError marks err as a usage error (exit 2, and a pointer to --help).
func usageError(err error) error {
	return &exitError{code: exitUsage, err: err, usage: true}
}

// action adapts a command body to cobra: errors that carry no exit code
// exit 1, so that untyped errors reaching execute are known to be cobra's
// own (usage errors).
func action(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := fn(cmd, args)
		if err == nil {
			return nil
		}
		var ee *exitError
		if errors.As(err, &ee) {
			return err
		}
		return &exitError{code: exitFailure, err: err}
	}
}

// argsUsage wraps a cobra argument validator so that its complaint exits 2.
func argsUsage(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return usageError(err)
		}
		return nil
	}
}
