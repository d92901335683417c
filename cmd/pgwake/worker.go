package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/backoff"
	"github.com/pgwake/pgwake/internal/exechandler"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

func init() {
	register(command{
		name:    "worker",
		summary: "run workers whose handlers are shell commands; serve /metrics and /healthz",
		usage: `Usage: pgwake worker --handler KIND=exec:COMMAND [--handler ...] [--queues a,b]
                     [--concurrency N] [--job-timeout D] [--kind-timeout KIND=D ...]
                     [--metrics-addr 127.0.0.1:9464] [flags]

Runs workers for the given queues. Each --handler maps a job kind to a shell
command, run as sh -c COMMAND (pipes and redirects work) in its own process
group:
  - the payload (JSON) is on stdin;
  - PGWAKE_JOB_ID, PGWAKE_JOB_KIND, PGWAKE_JOB_QUEUE, PGWAKE_JOB_ATTEMPT,
    PGWAKE_JOB_MAX_ATTEMPTS and PGWAKE_JOB_PRIORITY are in the environment;
  - exit status 0 is success; anything else fails the attempt, and the last
    2 KiB of stderr become the job's error (retried with backoff until
    max attempts, then failed);
  - stdout and stderr are copied to the worker's stdout and stderr line by
    line, each line prefixed "job ID KIND stdout: " (or stderr) and with
    control characters escaped (\x1b), so they cannot pass for pgwake's log
    lines or drive a terminal;
  - the command inherits the worker's environment and working directory,
    except pgwake's connection settings: DATABASE_URL, every PGWAKE_
    variable and the libpq variables (PGPASSWORD, PGHOST, ...) are removed
    unless --handler-connection-env is given;
  - a control line on stdout asks for another outcome; the last one wins,
    whatever the exit status:
      ::pgwake snooze DURATION            pending again after DURATION, the
                                          attempt not counted
      ::pgwake cancel [REASON]            cancelled, not retried
      ::pgwake retry-after DURATION [REASON]
                                          failed attempt, retried after
                                          DURATION (on the last attempt the
                                          job fails)
    a malformed control line fails the attempt with an error naming it;
  - when the attempt ends early (pgwake jobs cancel of the running job, its
    timeout from --job-timeout or --kind-timeout, the shutdown deadline),
    the whole process group gets SIGTERM, then SIGKILL after --term-grace.
A job of a kind with no --handler fails its attempt ("no handler registered").

--periodic 'SPEC KIND [JSON]' enqueues one KIND job per slot of SPEC into
--periodic-queue (default: the first of --queues), with run_after at the
slot, however many workers run the same schedule: SPEC is a cron spec (5
fields, or 6 with seconds first; @hourly, @daily, ...; "CRON_TZ=Zone "
first for a zone other than UTC) or "@every D". JSON, when given, is the
payload. The schedule is named KIND (KIND@SPEC when one kind has several).
A slot that passed while no worker ran is run once when one starts, unless
--periodic-skip-missed. See pgwake periodic list.

SIGINT/SIGTERM: stop claiming, let running commands finish for up to
--shutdown-timeout, then kill them (their jobs stay pending and run again).
A second signal kills every running command and exits at once; the open
claim transactions roll back, so those jobs stay pending too.

/metrics (Prometheus) and /healthz (200 when the database answers) are
served on --metrics-addr, loopback by default; "off" disables them.

Every minute the workers delete finished jobs past their retention:
succeeded and cancelled after 24h, failed after 7 days (--retain-succeeded,
--retain-cancelled, --retain-failed; negative keeps them). Their events stay
until "pgwake events prune".

Example:
  pgwake worker --queues default,email --concurrency 4 \
    --handler 'email=exec:./send-mail.sh' \
    --handler 'resize=exec:convert - -resize 50% out/$PGWAKE_JOB_ID.png' \
    --kind-timeout resize=2m \
    --handler 'report=exec:./report.sh' --periodic '0 6 * * * report {"daily":true}'`,
		run: runWorker,
	})
}

// multiFlag collects a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ", ") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

// workerOptions are the parsed worker flags.
type workerOptions struct {
	queues          []string
	concurrency     int
	handlers        map[string]string // kind -> shell command
	jobTimeout      time.Duration
	kindTimeouts    map[string]time.Duration
	pollInterval    time.Duration
	shutdownTimeout time.Duration
	retryBackoff    time.Duration
	metricsAddr     string
	listenerURL     string
	retention       queue.Retention
	leased          []string
	leaseDuration   time.Duration
	periodic        []queue.PeriodicJob
	handlerConnEnv  bool
	termGrace       time.Duration
}

func runWorker(ctx context.Context, env *cliEnv, args []string) error {
	o, err := parseWorkerFlags(env, args)
	if err != nil {
		return err
	}
	pool, err := env.connectWith(ctx, func(c *pgxpool.Config) { sizeWorkerPool(c, o) })
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := newRegistry()
	cfg, err := workerConfig(env, o, reg)
	if err != nil {
		return err
	}
	client, err := queue.New(pool, cfg)
	if err != nil {
		return usagef("%v", err)
	}
	if err := checkSchema(ctx, pool, env.schema); err != nil {
		return err
	}
	return serveWorker(ctx, env, o, client, reg)
}

// workerFlags are the flags whose values parseWorkerFlags checks and turns
// into workerOptions.
type workerFlags struct {
	queues, periodicQueue                *string
	periodicSkip                         *bool
	handlers, timeouts, leased, periodic multiFlag
	checkRetention                       func() error
}

// parseWorkerFlags parses and checks the worker's flags: every usage error
// is reported before anything connects.
func parseWorkerFlags(env *cliEnv, args []string) (workerOptions, error) {
	fs := env.flags()
	var f workerFlags
	var o workerOptions
	f.queues = fs.String("queues", queue.DefaultQueue, "comma-separated queues to work")
	fs.IntVar(&o.concurrency, "concurrency", 10, "jobs run at once per queue")
	fs.Var(&f.handlers, "handler", "KIND=exec:COMMAND, repeatable")
	fs.DurationVar(&o.jobTimeout, "job-timeout", time.Minute, "longest one attempt may run; 0 or negative: no limit")
	fs.Var(&f.timeouts, "kind-timeout", "KIND=DURATION, overrides --job-timeout for a kind, repeatable")
	fs.Var(&f.leased, "leased", "KIND: run that kind in leased mode (claim commits, no transaction held while the command runs, lease renewed by heartbeat), repeatable")
	fs.DurationVar(&o.leaseDuration, "lease-duration", queue.DefaultLeaseDuration, "how long a leased job's claim lasts without a heartbeat (renewed every third of it)")
	fs.DurationVar(&o.pollInterval, "poll-interval", 2*time.Second, "longest a worker waits without looking when no NOTIFY arrives")
	fs.DurationVar(&o.termGrace, "term-grace", 5*time.Second, "when a command's attempt ends early (jobs cancel, timeout, shutdown deadline): time between SIGTERM and SIGKILL to its process group; 0 sends SIGKILL at once")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long running jobs may finish after SIGINT/SIGTERM; 0 stops them at once")
	fs.DurationVar(&o.retryBackoff, "retry-backoff", 30*time.Second, "delay before the first retry; doubles per attempt, capped at 24h")
	fs.StringVar(&o.metricsAddr, "metrics-addr", defaultMetricsAddr, "address for /metrics and /healthz; \"off\" to disable")
	fs.BoolVar(&o.handlerConnEnv, "handler-connection-env", false, "pass pgwake's connection settings (DATABASE_URL, PGWAKE_*, PGPASSWORD and the other libpq PG* variables) to handler commands; default: removed from their environment")
	f.checkRetention = retentionFlags(fs, "retain-", &o.retention)
	fs.Var(&f.periodic, "periodic", "'SPEC KIND [JSON]': enqueue a KIND job (payload JSON) once per slot of SPEC (cron, or @every D), whatever the number of workers; repeatable")
	f.periodicQueue = fs.String("periodic-queue", "", "queue of the --periodic jobs (default: the first of --queues)")
	f.periodicSkip = fs.Bool("periodic-skip-missed", false, "skip --periodic slots that passed while no worker ran (default: run the latest of them once)")
	fs.StringVar(&o.listenerURL, "listener-url", "", "direct PostgreSQL URL for LISTEN when --database-url goes through PgBouncer in transaction mode ($PGWAKE_LISTENER_URL)")
	if err := env.parseNoArgs(fs, args); err != nil {
		return o, err
	}
	if o.listenerURL == "" {
		o.listenerURL = envOr(envListenerURL, "")
	}
	return o, checkWorkerFlags(&o, f)
}

// checkWorkerFlags fills o from f's values and checks every value.
func checkWorkerFlags(o *workerOptions, f workerFlags) error {
	var err error
	if o.queues, err = parseQueues(*f.queues); err != nil {
		return err
	}
	if o.concurrency < 1 || o.concurrency > queue.MaxMaxWorkers {
		return usagef("--concurrency %d is outside 1..%d", o.concurrency, queue.MaxMaxWorkers)
	}
	if o.handlers, err = parseHandlers(f.handlers); err != nil {
		return err
	}
	if o.kindTimeouts, err = parseKindTimeouts(f.timeouts, o.handlers); err != nil {
		return err
	}
	for _, k := range f.leased {
		if _, ok := o.handlers[k]; !ok {
			return usagef("--leased %q: no --handler for that kind", k)
		}
	}
	o.leased = f.leased
	pq := *f.periodicQueue
	if pq == "" {
		pq = o.queues[0]
	}
	if o.periodic, err = parsePeriodic(f.periodic, pq, *f.periodicSkip); err != nil {
		return err
	}
	if o.pollInterval < queue.MinPollInterval {
		return usagef("--poll-interval %s is below %s", o.pollInterval, queue.MinPollInterval)
	}
	if o.retryBackoff <= 0 {
		return usagef("--retry-backoff must be positive")
	}
	if o.retryBackoff > maxRetryBackoff {
		// The cap: a larger first delay would exceed it, then the retries
		// after it would fall back to it (TestRetryBackoffAboveItsCap).
		return usagef("--retry-backoff %s is above the retries' cap of %s", o.retryBackoff, maxRetryBackoff)
	}
	if o.termGrace < 0 {
		return usagef("--term-grace is negative")
	}
	if o.shutdownTimeout < 0 {
		return usagef("--shutdown-timeout is negative")
	}
	return f.checkRetention()
}

// maxRetryBackoff caps the worker's retry delays (--retry-backoff).
const maxRetryBackoff = 24 * time.Hour

// workerQueues is each of o's queues with o's concurrency.
func workerQueues(o workerOptions) map[string]queue.QueueConfig {
	qs := make(map[string]queue.QueueConfig, len(o.queues))
	for _, q := range o.queues {
		qs[q] = queue.QueueConfig{MaxWorkers: o.concurrency}
	}
	return qs
}

// sizeWorkerPool raises the pool to what the workers need
// (queue.MinPoolConns: every running job holds its claim transaction's
// connection), plus one for the health check, unless the URL sets
// pool_max_conns.
func sizeWorkerPool(c *pgxpool.Config, o workerOptions) {
	if need := int32(queue.MinPoolConns(queue.Config{Queues: workerQueues(o)}) + 1); c.MaxConns < need && !strings.Contains(c.ConnString(), "pool_max_conns") {
		c.MaxConns = need
	}
}

// workerConfig builds the client's config: exec handlers, queues, timeouts,
// the retry backoff and the LISTEN connection.
func workerConfig(env *cliEnv, o workerOptions, reg *prometheus.Registry) (queue.Config, error) {
	var listenerCC *pgx.ConnConfig
	if o.listenerURL != "" {
		var err error
		if listenerCC, err = pgx.ParseConfig(o.listenerURL); err != nil {
			return queue.Config{}, usagef("--listener-url %s: %s", redactURL(o.listenerURL), parseErrCause(err))
		}
	}
	procs := exechandler.NewProcGroups()
	env.onHardStop(procs.KillAll)
	handlers := make(map[string]queue.Handler, len(o.handlers))
	environ := exechandler.Environ(os.Environ(), o.handlerConnEnv)
	for kind, command := range o.handlers {
		handlers[kind] = &exechandler.Handler{Command: command, Env: environ, Stdout: env.stdout, Stderr: env.stderr, Procs: procs, Grace: o.termGrace}
	}
	jobTimeout := o.jobTimeout
	if jobTimeout <= 0 {
		jobTimeout = -1
	}
	// queue.Config reads 0 as "the default" (10s); on the command line 0
	// means no time at all: running commands are stopped at once, as
	// --term-grace 0 sends SIGKILL at once.
	shutdownTimeout := o.shutdownTimeout
	if shutdownTimeout == 0 {
		shutdownTimeout = time.Nanosecond
	}
	base := o.retryBackoff
	return queue.Config{
		Schema:             env.schema,
		Queues:             workerQueues(o),
		Handlers:           handlers,
		JobTimeout:         jobTimeout,
		KindTimeouts:       o.kindTimeouts,
		PollInterval:       o.pollInterval,
		ShutdownTimeout:    shutdownTimeout,
		Retention:          o.retention,
		LeasedKinds:        o.leased,
		LeaseDuration:      o.leaseDuration,
		Periodic:           o.periodic,
		Backoff:            func(attempt int) time.Duration { return backoff.Exponential(attempt, base, maxRetryBackoff) },
		ListenerConnConfig: listenerCC,
		Logger:             env.log,
		Registerer:         reg,
	}, nil
}

// serveWorker serves /metrics and /healthz (unless off) and runs client
// until ctx ends.
func serveWorker(ctx context.Context, env *cliEnv, o workerOptions, client *queue.Client, reg *prometheus.Registry) error {
	var ms *metricsServer
	if !metricsOff(o.metricsAddr) {
		var err error
		if ms, err = listenMetrics(o.metricsAddr, reg, client.Pool(), env.log); err != nil {
			return err
		}
		go ms.serve(env.log)
		defer ms.shutdown()
	}
	kinds := make([]string, 0, len(o.handlers))
	for k := range o.handlers {
		kinds = append(kinds, k)
	}
	fields := []zap.Field{zap.Strings("queues", o.queues), zap.Int("concurrency", o.concurrency),
		zap.Strings("kinds", kinds), zap.String("schema", env.schema)}
	if ms != nil {
		fields = append(fields, zap.String("metrics", "http://"+ms.addr+"/metrics"))
	}
	env.log.Info("pgwake worker started", fields...)
	if err := client.Run(ctx); err != nil {
		return err
	}
	env.log.Info("pgwake worker stopped")
	return nil
}

func parseQueues(s string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, q := range strings.Split(s, ",") {
		q = strings.TrimSpace(q)
		if q == "" {
			continue
		}
		if err := queue.ValidateQueue(q); err != nil {
			return nil, usagef("--queues: %v", err)
		}
		if !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	if len(out) == 0 {
		return nil, usagef("--queues is empty")
	}
	return out, nil
}

func parseHandlers(flags []string) (map[string]string, error) {
	if len(flags) == 0 {
		return nil, usagef("give at least one --handler KIND=exec:COMMAND")
	}
	out := map[string]string{}
	for _, f := range flags {
		kind, spec, ok := strings.Cut(f, "=")
		if !ok || kind == "" {
			return nil, usagef("--handler %q: expected KIND=exec:COMMAND", f)
		}
		if err := queue.ValidateKind(kind); err != nil {
			return nil, usagef("--handler %q: %v", f, err)
		}
		command, ok := strings.CutPrefix(spec, "exec:")
		if !ok {
			return nil, usagef("--handler %q: the handler must start with exec: (the only handler type), e.g. %s=exec:./run.sh", f, kind)
		}
		if strings.TrimSpace(command) == "" {
			return nil, usagef("--handler %q: empty command", f)
		}
		if _, dup := out[kind]; dup {
			return nil, usagef("--handler: kind %q given twice", kind)
		}
		out[kind] = command
	}
	return out, nil
}

func parseKindTimeouts(flags []string, handlers map[string]string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, f := range flags {
		kind, ds, ok := strings.Cut(f, "=")
		if !ok {
			return nil, usagef("--kind-timeout %q: expected KIND=DURATION, e.g. resize=2m", f)
		}
		d, err := time.ParseDuration(ds)
		if err != nil {
			return nil, usagef("--kind-timeout %q: %q is not a duration like 30s or 2m", f, ds)
		}
		if _, ok := handlers[kind]; !ok {
			return nil, usagef("--kind-timeout %q: no --handler for kind %q", f, kind)
		}
		if d <= 0 {
			d = -1
		}
		out[kind] = d
	}
	return out, nil
}

// checkSchema fails early, with the fix, when the schema is not migrated
// or lacks a migration this binary needs. A role that may not read the
// migrations table is not stopped (its statements will say what is wrong).
func checkSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	st, err := migrations.StatusOf(ctx, pool, schema)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			return nil
		}
		return fmt.Errorf("check schema %s: %w", schema, err)
	}
	missing := migrations.Pending(st)
	switch {
	case len(missing) == len(st):
		return fmt.Errorf("pgwake's tables are missing in schema %s; run `pgwake migrate --schema %s` first", schema, schema)
	case len(missing) > 0:
		return fmt.Errorf("schema %s lacks migration(s) %s; run `pgwake migrate --schema %s` first", schema, strings.Join(missing, ", "), schema)
	}
	return nil
}

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

// parsePeriodic parses --periodic 'SPEC KIND [JSON]' flags: the JSON
// starts at the first '{' or '[' after a space, KIND is the word before
// it (or the last word), SPEC the rest.
func parsePeriodic(flags []string, q string, skip bool) ([]queue.PeriodicJob, error) {
	var out []queue.PeriodicJob
	kinds := map[string]int{}
	for _, f := range flags {
		head, payload := f, ""
		if i := strings.IndexAny(f, "{["); i > 0 && (f[i-1] == ' ' || f[i-1] == '\t') {
			head, payload = f[:i], strings.TrimSpace(f[i:])
		}
		words := strings.Fields(head)
		if len(words) < 2 {
			return nil, usagef("--periodic %q: expected 'SPEC KIND [JSON]', e.g. '@every 10m cleanup' or '0 6 * * * report {\"daily\":true}'", f)
		}
		kind := words[len(words)-1]
		spec := strings.Join(words[:len(words)-1], " ")
		if err := queue.ValidateKind(kind); err != nil {
			return nil, usagef("--periodic %q: %v", f, err)
		}
		if err := queue.ParseSpec(spec); err != nil {
			return nil, usagef("--periodic %q: %v", f, err)
		}
		p := queue.PeriodicJob{Spec: spec, Job: queue.NewJob{Kind: kind, Queue: q}, SkipMissed: skip}
		if payload != "" {
			if !json.Valid([]byte(payload)) {
				return nil, usagef("--periodic %q: the payload %.80q is not valid JSON", f, payload)
			}
			p.Job.Payload = json.RawMessage(payload)
		}
		kinds[kind]++
		out = append(out, p)
	}
	for i := range out {
		if kinds[out[i].Job.Kind] > 1 {
			out[i].Name = out[i].Job.Kind + "@" + out[i].Spec
		}
	}
	return out, nil
}
