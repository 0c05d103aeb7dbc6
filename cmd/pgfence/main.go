// Command pgfence is the operator's tool for pgfence: apply migrations, run a
// command under a lease or lock, inspect and break locks, and run the demo.
package main

func main() {}
