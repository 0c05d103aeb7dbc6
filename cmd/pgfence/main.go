// Command pgfence is the operator's tool for pgfence: apply migrations, run a
// command under a lease or lock, inspect and break locks, and run the demo.
//
// Run `pgfence --help` for the commands, the connection settings and the
// exit codes.
package main

import (
	"os"
)

func main() {
	os.Exit(execute(os.Args[1:]))
}
