package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pgwake/pgwake/migrations"
)

// command is one subcommand of pgwake.
//
// The registry below is how subcommands are added: any file of package main
// calls register from its init function, e.g. events*.go registers "events"
// and bench*.go registers "bench", without touching this file or main.go.
// run parses its own args with env.flags (which adds the common
// --database-url and --schema flags), gets a database pool with
// env.connect, writes results to env.stdout and returns an error to fail:
// the error is printed as one line on stderr and pgwake exits non-zero
// (2 for usage errors, see usageError).
//
// Tests of package main share one TestMain (cli_main_test.go: a PostgreSQL
// from pgtest) and its helpers: pgwake(t, stdin, args...) runs the real
// binary to completion, startPgwake(t, args...) runs it in the background.
type command struct {
	name    string // as typed: "worker"
	summary string // one line for `pgwake help`
	usage   string // full help text: synopsis, description, an example
	run     func(ctx context.Context, env *cliEnv, args []string) error
}

var (
	registryMu sync.Mutex
	registry   = map[string]command{}
)

// register adds a subcommand. It panics on a duplicate or malformed entry,
// which is a programming error caught by any test run.
func register(c command) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if c.name == "" || c.run == nil || c.summary == "" || c.usage == "" {
		panic(fmt.Sprintf("pgwake: command %q needs name, summary, usage and run", c.name))
	}
	if _, dup := registry[c.name]; dup {
		panic(fmt.Sprintf("pgwake: command %q registered twice", c.name))
	}
	registry[c.name] = c
}

func lookup(name string) (command, bool) {
	registryMu.Lock()
	defer registryMu.Unlock()
	c, ok := registry[name]
	return c, ok
}

func commandNames() []string {
	registryMu.Lock()
	defer registryMu.Unlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Environment variables read by every command.
const (
	envDatabaseURL = "PGWAKE_DATABASE_URL"
	envFallbackURL = "DATABASE_URL"
	envSchema      = "PGWAKE_SCHEMA"
	envLogLevel    = "PGWAKE_LOG_LEVEL"
	// envListenerURL is worker --listener-url's variable.
	envListenerURL = "PGWAKE_LISTENER_URL"
	// envBrokerURL is events forward --to's variable.
	envBrokerURL = "PGWAKE_BROKER_URL"
	// envUIToken is ui --token's variable.
	envUIToken = "PGWAKE_UI_TOKEN"
)

// cliEnv is what a command runs with.
type cliEnv struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// log writes structured logs to stderr (level from --log-level or
	// PGWAKE_LOG_LEVEL, default info).
	log *zap.Logger
	// databaseURL is the --database-url flag ("" means: from the environment).
	databaseURL string
	// schema is the --schema flag, PGWAKE_SCHEMA, or "pgwake".
	schema   string
	logLevel string
	cmd      command

	hardMu   sync.Mutex
	hardStop []func() // run on the second SIGINT/SIGTERM before exiting
}

// usageError is a bad command line: printed with a pointer to --help, exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// flags returns a flag set for the running command with the common flags
// (--database-url, --schema, --log-level) already defined.
func (env *cliEnv) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("pgwake "+env.cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by runMain, help by printHelp
	fs.StringVar(&env.databaseURL, "database-url", "", "PostgreSQL URL (default $"+envDatabaseURL+", then $"+envFallbackURL+")")
	fs.StringVar(&env.schema, "schema", envOr(envSchema, migrations.DefaultSchema), "schema holding pgwake's tables ($"+envSchema+")")
	fs.StringVar(&env.logLevel, "log-level", envOr(envLogLevel, "info"), "log level: debug, info, warn, error ($"+envLogLevel+")")
	fs.Usage = func() {}
	return fs
}

// parse parses args into fs, turning flag errors into usage errors and -h
// into help output. It returns errHelp after printing help.
// parseNoArgs is parse for commands that take flags only.
func (env *cliEnv) parseNoArgs(fs *flag.FlagSet, args []string) error {
	if err := env.parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

func (env *cliEnv) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(reorderArgs(fs, args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			env.printHelp(fs)
			return errHelp
		}
		return usagef("%v", err)
	}
	if err := migrations.ValidateSchema(env.schema); err != nil {
		return usagef("--schema: %v", err)
	}
	log, err := newLogger(env.stderr, env.logLevel)
	if err != nil {
		return err
	}
	env.log = log
	return nil
}

// interruptedError is an error for a command cut short by a signal, with a
// message of its own; it matches context.Canceled (exit 130).
type interruptedError string

func (e interruptedError) Error() string { return string(e) }
func (e interruptedError) Unwrap() error { return context.Canceled }

// errHelp means help was printed: exit 0.
var errHelp = errors.New("help printed")

func (env *cliEnv) printHelp(fs *flag.FlagSet) {
	w := env.stdout
	fmt.Fprintln(w, strings.TrimSpace(env.cmd.usage))
	fmt.Fprintln(w, "\nFlags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// onHardStop registers f to run when a second SIGINT/SIGTERM arrives, just
// before pgwake exits without waiting (kill child processes, remove
// temporary clusters).
func (env *cliEnv) onHardStop(f func()) {
	env.hardMu.Lock()
	env.hardStop = append(env.hardStop, f)
	env.hardMu.Unlock()
}

func (env *cliEnv) runHardStop() {
	env.hardMu.Lock()
	fs := env.hardStop
	env.hardMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

func newLogger(w io.Writer, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, usagef("--log-level %q: use debug, info, warn or error", level)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	enc.EncodeLevel = zapcore.CapitalLevelEncoder
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(w), lvl)
	return zap.New(core), nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// exitHard is how a second signal ends the process; a variable for tests.
var exitHard = os.Exit

// runMain runs one pgwake command line and returns the exit status.
func runMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printOverview(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c, ok := lookup(args[1]); ok {
				return runCommand(c, []string{"--help"}, stdin, stdout, stderr)
			}
			fmt.Fprintf(stderr, "pgwake: unknown command %q; run `pgwake help` for the list\n", args[1])
			return 2
		}
		printOverview(stdout)
		return 0
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, "pgwake", version())
		return 0
	}
	c, ok := lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "pgwake: unknown command %q; run `pgwake help` for the list\n", name)
		return 2
	}
	return runCommand(c, args[1:], stdin, stdout, stderr)
}

func runCommand(c command, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	env := &cliEnv{stdin: stdin, stdout: stdout, stderr: stderr, cmd: c, log: zap.NewNop(),
		schema: migrations.DefaultSchema}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// First SIGINT/SIGTERM cancels ctx (graceful); the second runs the
	// hard-stop hooks and exits at once.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-sigs:
		case <-done:
			return
		}
		fmt.Fprintln(stderr, "pgwake: signal received, shutting down gracefully (send it again to stop at once)")
		stop()
		select {
		case <-sigs:
		case <-done:
			return
		}
		fmt.Fprintln(stderr, "pgwake: second signal, stopping now")
		env.runHardStop()
		exitHard(130)
	}()

	err := c.run(ctx, env, args)
	_ = env.log.Sync()
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		return 0
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		msg := "interrupted"
		if err != context.Canceled { //nolint:errorlint // a bare Canceled gets the short message
			msg = oneLine(err.Error())
		}
		fmt.Fprintf(stderr, "pgwake %s: %s\n", c.name, msg)
		return 130
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "pgwake %s: %s (see `pgwake %s --help`)\n", c.name, oneLine(ue.msg), c.name)
		return 2
	}
	fmt.Fprintf(stderr, "pgwake %s: %s\n", c.name, oneLine(err.Error()))
	return 1
}

// oneLine folds a multi-line error into one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\t", " ")), " ")
}

func printOverview(w io.Writer) {
	fmt.Fprint(w, `pgwake: a job queue in PostgreSQL.

Usage: pgwake <command> [flags]

Commands:
`)
	for _, n := range commandNames() {
		c, _ := lookup(n)
		fmt.Fprintf(w, "  %-9s %s\n", n, c.summary)
	}
	fmt.Fprint(w, `
Every command takes --database-url (default $PGWAKE_DATABASE_URL, then
$DATABASE_URL) and --schema (default pgwake). Run `+"`pgwake <command> --help`"+`
for its flags and an example. Try it without a database: `+"`pgwake demo`"+`.
`)
}

// duration formatting helper shared by several commands.
func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d
}

// version is the module version from the build info ("(devel)" for a
// local build), plus the VCS revision when known.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}
