package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/pgcluster"
)

// Options configures Run.
type Options struct {
	// DatabaseURL is the server to run on. Empty: a throwaway cluster
	// (internal/pgcluster) with fsync and full_page_writes on, removed
	// afterwards.
	DatabaseURL string
	// Modes to run, in order. Default AllModes.
	Modes []Mode
	// Sizes are the modes' parameters.
	Sizes Sizes
	// Workers is every system's concurrency (pgwake MaxWorkers, River
	// MaxWorkers). Default 10, pgwake's default MaxWorkers.
	Workers int
	// Runs repeats every mode; figures are the medians. Default 1.
	Runs int
	// Out gets the report; Log gets progress lines. Defaults os.Stdout and
	// os.Stderr.
	Out, Log io.Writer
	// JSON prints one JSON object per mode and system instead of tables.
	JSON bool
	// SVG, when set, is the path of an SVG latency chart to write.
	SVG string
	// Commit is the pgwake commit the figures belong to, for the report.
	// Default Commit(".").
	Commit string
	// OnCluster, when set, is given a function that removes the throwaway
	// cluster at once, for a hard stop (second Ctrl-C) of the caller.
	OnCluster func(stop func())
	// Stream runs the stream mode once per run (this package cannot import
	// the events packages; cmd/pgwake sets it). Nil: the stream mode is an
	// error.
	Stream func(ctx context.Context, env *Env, sizes Sizes) (Result, error)
}

func (o Options) withDefaults() Options {
	if len(o.Modes) == 0 {
		o.Modes = AllModes
	}
	o.Sizes = o.Sizes.withDefaults()
	if o.Workers == 0 {
		o.Workers = 10
	}
	if o.Runs == 0 {
		o.Runs = 1
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	if o.Commit == "" {
		o.Commit = Commit(".")
	}
	return o
}

// ErrInvalidOptions is wrapped by Run's errors for bad options.
var ErrInvalidOptions = errors.New("invalid bench options")

func (o Options) validate() error {
	if o.Workers < 1 || o.Workers > 1000 {
		return fmt.Errorf("%w: workers must be in 1..1000, got %d", ErrInvalidOptions, o.Workers)
	}
	if o.Runs < 1 || o.Runs > 100 {
		return fmt.Errorf("%w: runs must be in 1..100, got %d", ErrInvalidOptions, o.Runs)
	}
	for _, m := range o.Modes {
		if !m.valid() {
			return fmt.Errorf("%w %q", ErrUnknownMode, m)
		}
	}
	return o.Sizes.validate()
}

// Run runs every mode for every system (pgwake first, then peers), Runs
// times, on one database, prints the report and returns the medians. A mode
// a system does not support is skipped. The first error stops the run; the
// results so far are returned with it.
func Run(ctx context.Context, opts Options, systems ...System) ([]Result, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if len(systems) == 0 {
		return nil, fmt.Errorf("%w: no systems to run", ErrInvalidOptions)
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(opts.Log, time.Now().Format("15:04:05 ")+format+"\n", args...)
	}
	pool, closeDB, err := openDatabase(ctx, opts, logf)
	defer closeDB()
	if err != nil {
		return nil, err
	}
	server := describeServer(ctx, pool)
	logf("server: %s", server)

	loadStart := loadAverage()
	env := &Env{Pool: pool, Workers: opts.Workers, Logf: logf}
	var runs [][]Result
	var runErr error
	for i := range opts.Runs {
		run, err := runOnce(ctx, env, opts, systems, i)
		runs = append(runs, run)
		if err != nil {
			runErr = err
			break
		}
	}
	results := Median(runs)
	rep := Report{
		Results: results, Systems: systems, Commit: opts.Commit, Server: server,
		Workers: opts.Workers, Sizes: opts.Sizes, Runs: opts.Runs,
		Load: fmt.Sprintf("load average %s at start, %s at end", loadStart, loadAverage()),
	}
	if err := writeReport(opts, rep, logf); err != nil {
		return results, err
	}
	return results, runErr
}

// openDatabase connects to opts.DatabaseURL, or to a throwaway cluster it
// starts. closeDB (never nil, to be called even on an error) closes the
// pool and stops the cluster.
func openDatabase(ctx context.Context, opts Options, logf func(string, ...any)) (pool *pgxpool.Pool, closeDB func(), err error) {
	url := opts.DatabaseURL
	var closers []func()
	closeDB = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if url == "" {
		logf("starting a throwaway PostgreSQL cluster (fsync on)")
		c, err := StartCluster(ctx, logf)
		if err != nil {
			return nil, closeDB, err
		}
		closers = append(closers, func() {
			if err := c.Stop(); err != nil {
				logf("stop cluster: %v", err)
			}
		})
		if opts.OnCluster != nil {
			opts.OnCluster(func() { _ = c.Stop() })
		}
		url = c.URL
	}
	pcfg, err := poolConfig(url, opts)
	if err != nil {
		return nil, closeDB, err
	}
	if pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, closeDB, fmt.Errorf("bench: connect: %w", err)
	}
	closers = append(closers, pool.Close)
	if err := pool.Ping(ctx); err != nil {
		return nil, closeDB, fmt.Errorf("bench: connect: %w", err)
	}
	return pool, closeDB, nil
}

// runOnce runs every mode of opts once (run i of opts.Runs) on every system
// that supports it. On an error it returns the results so far.
func runOnce(ctx context.Context, env *Env, opts Options, systems []System, i int) ([]Result, error) {
	logf := env.Logf
	var run []Result
	for _, mode := range opts.Modes {
		if mode == ModeStream {
			if opts.Stream == nil {
				return run, fmt.Errorf("%w: the stream mode runs only from pgwake bench", ErrInvalidOptions)
			}
			logf("run %d/%d: %s: pgwake", i+1, opts.Runs, mode)
			r, err := opts.Stream(ctx, env, opts.Sizes)
			r.Runs = 1
			logf("result: %s", summaryLine(r))
			run = append(run, r)
			if err != nil {
				return run, fmt.Errorf("pgwake %s: %w", mode, err)
			}
			continue
		}
		for _, sys := range systems {
			if _, ok := sys.(Housekeeper); !sys.Supports(mode) || (mode == ModeHousekeeping && !ok) {
				continue
			}
			logf("run %d/%d: %s: %s", i+1, opts.Runs, mode, sys.Name())
			rn := &runner{sys: sys, env: env, sizes: opts.Sizes, logf: logf}
			rs, err := rn.run(ctx, mode)
			for j := range rs {
				rs[j].Runs = 1
				logf("result: %s", summaryLine(rs[j]))
			}
			run = append(run, rs...)
			if err != nil {
				return run, fmt.Errorf("%s %s: %w", sys.Name(), mode, err)
			}
		}
	}
	return run, nil
}

// writeReport writes rep to opts.Out (text or JSON) and the chart to
// opts.SVG.
func writeReport(opts Options, rep Report, logf func(string, ...any)) error {
	if opts.JSON {
		if err := rep.WriteJSON(opts.Out); err != nil {
			return err
		}
	} else {
		rep.WriteText(opts.Out)
	}
	if opts.SVG != "" {
		if err := os.WriteFile(opts.SVG, []byte(rep.SVG()), 0o644); err != nil {
			return fmt.Errorf("bench: write chart: %w", err)
		}
		logf("wrote %s", opts.SVG)
	}
	return nil
}

// StartCluster starts a throwaway PostgreSQL cluster configured like a
// real server: fsync, full_page_writes and synchronous_commit on. Stop it
// when done.
func StartCluster(ctx context.Context, logf func(format string, args ...any)) (*pgcluster.Cluster, error) {
	c, err := pgcluster.Start(ctx, pgcluster.Options{
		Logf: logf,
		ExtraConf: map[string]string{
			"fsync":              "on",
			"full_page_writes":   "on",
			"synchronous_commit": "on",
			"max_wal_size":       "2GB",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("bench: start PostgreSQL: %w", err)
	}
	return c, nil
}

// poolConfig sizes the pool for the workers, the producers and the bench's
// own queries.
func poolConfig(url string, opts Options) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%w: database URL: %w", ErrInvalidOptions, err)
	}
	need := int32(opts.Workers + max(opts.Sizes.Producers, opts.Sizes.LatencyProducers) + 8)
	if cfg.MaxConns < need {
		cfg.MaxConns = need
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "pgwake-bench"
	}
	return cfg, nil
}

func describeServer(ctx context.Context, pool *pgxpool.Pool) string {
	var ver, fsync, sc, sb string
	err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('shared_buffers')`).Scan(&ver, &fsync, &sc, &sb)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return fmt.Sprintf("PostgreSQL %s, fsync=%s, synchronous_commit=%s, shared_buffers=%s", ver, fsync, sc, sb)
}

// summaryLine is one result on one line, for the progress log.
func summaryLine(r Result) string {
	return fmt.Sprintf("%s %s jobs=%d jobs/s=%s p50=%s p90=%s p99=%s max=%s dup=%d missing=%d %s",
		r.System, caseName(r), r.Jobs, num(r.JobsPerSec), num(r.P50), num(r.P90), num(r.P99), num(r.Max),
		r.Duplicates, r.Missing, notes(r))
}

// loadAverage is the 1-minute load average from /proc/loadavg, or "?": the
// machine may be shared, and a busy one skews every figure.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// WriteJSON writes one JSON object per line per result.
func (rep Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	for _, r := range rep.Results {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
