// Command pgwake runs, watches and repairs a pgwake job queue from the shell:
// migrate the schema, enqueue jobs, run workers whose handlers are external
// commands, show stats, inspect and repair jobs, and run a self-contained
// demo. Run `pgwake help` for the list of commands and docs/cli.md for the
// reference.
//
// Subcommands register themselves from init functions (see command and
// register in cli.go), so a new one is a new file in this package.
package main
