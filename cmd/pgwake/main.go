// Command pgwake runs, watches and repairs a pgwake job queue from the shell:
// migrate the schema, enqueue jobs, run workers whose handlers are external
// commands, show stats, inspect and repair jobs, and run a self-contained
// demo. Run `pgwake help` for the list of commands.
package main

import (
	"os"
)

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
