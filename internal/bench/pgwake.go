package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgwake/pgwake/internal/promreg"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// Pgwake is pgwake as a System: queue.Config defaults, with one queue
// ("bench", MaxWorkers = Env.Workers) and one kind ("bench") whose handler
// only reports its job. Each Setup migrates a fresh schema.
type Pgwake struct {
	// Label is the result's system name. Default "pgwake".
	Label string
	// Tune, when set, changes the config after the bench's settings (for
	// experiments; results then no longer show the defaults).
	Tune func(*queue.Config)
	// Leased runs the bench kind in leased mode (Config.LeasedKinds): the
	// claim commits, handlers hold no connection. It takes part in the
	// concurrent mode, which held mode cannot run on a small pool.
	Leased bool
	// SQL makes Enqueue call the SQL API (SELECT <schema>.enqueue(...)
	// through pgx) instead of the Go client; the system then runs the
	// enqueue mode only. Name defaults to "pgwake-sql".
	SQL bool

	env    *Env
	schema string
	client *queue.Client
	n      atomic.Int64
	reg    *prometheus.Registry // of the last Start's client
}

// BenchQueue and BenchKind are the queue and kind of every bench job.
const (
	BenchQueue = "bench"
	BenchKind  = "bench"
)

// Name returns Label, or "pgwake" ("pgwake-leased" when Leased, "pgwake-sql"
// with SQL).
func (p *Pgwake) Name() string {
	switch {
	case p.Label != "":
		return p.Label
	case p.Leased:
		return "pgwake-leased"
	}
	if p.SQL {
		return SQLSystem
	}
	return "pgwake"
}

// SQLSystem is the name of the Pgwake system that enqueues through the SQL
// API.
const SQLSystem = "pgwake-sql"

// Config describes the configuration.
func (p *Pgwake) Config() string {
	s := "queue.Config defaults; Queues{bench: MaxWorkers=workers}; one no-op handler"
	if p.Leased {
		s += "; LeasedKinds{bench}"
	}
	if p.SQL {
		s = "SELECT <schema>.enqueue(kind, payload, queue => 'bench') through pgx, one job per transaction"
	}
	if p.Tune != nil {
		s += "; tuned by the caller"
	}
	return s
}

// Supports: held mode every mode but concurrent; leased mode drain,
// latency, idle, delayed and concurrent; SQL enqueue only.
func (p *Pgwake) Supports(m Mode) bool {
	switch {
	case p.SQL:
		return m == ModeEnqueue
	case p.Leased:
		// Enqueue, scale and housekeeping are the same in both modes.
		return m == ModeDrain || m == ModeLatency || m == ModeIdle || m == ModeDelayed || m == ModeConcurrent
	}
	// Held mode holds a connection per running job: not on a small pool.
	return m != ModeConcurrent
}

func (p *Pgwake) config(handle HandleFunc) queue.Config {
	cfg := queue.Config{
		Schema: p.schema,
		Queues: map[string]queue.QueueConfig{BenchQueue: {MaxWorkers: p.env.Workers}},
	}
	if handle != nil {
		cfg.Handlers = map[string]queue.Handler{BenchKind: queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job *queue.Job) error {
			var pl Payload
			if err := json.Unmarshal(job.Payload, &pl); err != nil {
				return fmt.Errorf("bench payload: %w", err)
			}
			handle(pl.Seq)
			if pl.SleepMS > 0 {
				select {
				case <-time.After(time.Duration(pl.SleepMS) * time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})}
	}
	if p.Leased {
		cfg.AllowSmallPool = true // leased handlers hold no connection
		if handle != nil {
			cfg.LeasedKinds = []string{BenchKind}
		}
		cfg.LeaseDuration = p.env.LeaseDuration // zero: the default
	}
	if p.Tune != nil {
		p.Tune(&cfg)
	}
	return cfg
}

// Schema is the schema of the last Setup.
func (p *Pgwake) Schema() string { return p.schema }

// Setup migrates a fresh schema.
func (p *Pgwake) Setup(ctx context.Context, env *Env) error {
	p.env = env
	p.schema = fmt.Sprintf("pgwake_bench_%d_%d", time.Now().UnixNano()%1e9, p.n.Add(1))
	if _, err := migrations.Up(ctx, env.Pool, p.schema); err != nil {
		return err
	}
	// The producer: no workers (Queues need Handlers).
	pcfg := p.config(nil)
	pcfg.Queues = nil
	c, err := queue.New(env.Pool, pcfg)
	if err != nil {
		return err
	}
	p.client = c
	return nil
}

func newJob(j Job) queue.NewJob {
	return queue.NewJob{Queue: BenchQueue, Kind: BenchKind, Payload: json.RawMessage(EncodePayload(j)), RunAfter: j.RunAt}
}

// InsertMany uses EnqueueMany.
func (p *Pgwake) InsertMany(ctx context.Context, jobs []Job) error {
	nj := make([]queue.NewJob, len(jobs))
	for i, j := range jobs {
		nj[i] = newJob(j)
	}
	_, err := p.client.EnqueueMany(ctx, nj)
	return err
}

// Enqueue uses Enqueue (one statement, its own transaction), or with SQL
// one SELECT of the SQL API's enqueue (also its own transaction).
func (p *Pgwake) Enqueue(ctx context.Context, job Job) error {
	if p.SQL {
		var runAfter *time.Time
		if !job.RunAt.IsZero() {
			runAfter = &job.RunAt
		}
		_, err := p.env.Pool.Exec(ctx, `SELECT `+sqlident.Quote(p.schema, "enqueue")+`($1::text, $2::jsonb, queue => $3::text, run_after => $4::timestamptz)`,
			BenchKind, string(EncodePayload(job)), BenchQueue, runAfter)
		return err
	}
	_, err := p.client.Enqueue(ctx, newJob(job))
	return err
}

// Start runs a Client with the bench handler.
func (p *Pgwake) Start(ctx context.Context, handle HandleFunc) (func() error, error) {
	cfg := p.config(handle)
	p.reg = prometheus.NewRegistry()
	if cfg.Registerer == nil {
		cfg.Registerer = p.reg
	}
	c, err := queue.New(p.env.Pool, cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var stopped atomic.Bool
	var result error
	return func() error {
		if stopped.CompareAndSwap(false, true) {
			cancel()
			result = <-done
		}
		return result
	}, nil
}

// Diagnostics returns the last Start's claims by what woke the worker
// (pgwake_worker_claims_total by source) as claims_<source>: many "poll"
// claims mean notifications were missed.
func (p *Pgwake) Diagnostics() map[string]float64 {
	out := map[string]float64{}
	if p.reg == nil {
		return out
	}
	by, _ := promreg.SumBy(p.reg, "pgwake_worker_claims_total", "source") // no figures on error
	for source, n := range by {
		out["claims_"+source] = n
	}
	// The heartbeat's load: statements that extended the leases, and their
	// time (send to last row) in all.
	if n, err := promreg.Sum(p.reg, "pgwake_worker_lease_heartbeat_seconds"); err == nil && n > 0 {
		sum, _ := promreg.SampleSum(p.reg, "pgwake_worker_lease_heartbeat_seconds")
		out["lease_heartbeats"], out["lease_heartbeat_ms_total"] = n, sum*1000
	}
	return out
}

// Unfinished counts pending and running jobs, through the read API with
// exact counts.
func (p *Pgwake) Unfinished(ctx context.Context) (int64, error) {
	st, err := p.client.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: -1})
	var n int64
	for _, q := range st {
		n += q.Pending + q.Scheduled + q.Running
	}
	return n, err
}

// InsertFinished writes n succeeded jobs, finished 59 minutes ago, with
// their enqueued and succeeded events (queue.Client.SeedFinished), then
// vacuums the tables.
func (p *Pgwake) InsertFinished(ctx context.Context, n int) error {
	const chunk = 100000
	at := time.Now().Add(-59 * time.Minute)
	for from := 0; from < n; from += chunk {
		if _, err := p.client.SeedFinished(ctx, queue.FinishedSeed{Count: min(chunk, n-from), Queue: BenchQueue, Kind: BenchKind,
			State: queue.StateSucceeded, FinishedAt: at, SeqPayload: true, Events: queue.SeedAllEvents}); err != nil {
			return err
		}
	}
	return p.client.VacuumAnalyze(ctx)
}

// InsertFailed writes n failed jobs, finished 1 to 6 days ago (inside the
// default 7-day retention of failed jobs), with their enqueued and failed
// events (queue.Client.SeedFinished). The caller settles the tables.
func (p *Pgwake) InsertFailed(ctx context.Context, n int) error {
	const chunk = 100000
	at := time.Now().Add(-24 * time.Hour)
	spacing := 5 * 24 * time.Hour / time.Duration(max(n, 1))
	for from := 0; from < n; from += chunk {
		if _, err := p.client.SeedFinished(ctx, queue.FinishedSeed{Count: min(chunk, n-from), Queue: BenchQueue, Kind: BenchKind,
			State: queue.StateFailed, FinishedAt: at.Add(-time.Duration(from) * spacing), Spacing: spacing,
			LastError: "bench: kept failed job", Events: queue.SeedAllEvents}); err != nil {
			return err
		}
	}
	return nil
}

// Client is the client of the last Setup (no handlers, not running).
func (p *Pgwake) Client() *queue.Client { return p.client }

// Teardown drops the schema.
func (p *Pgwake) Teardown(ctx context.Context) error {
	if p.schema == "" {
		return nil
	}
	_, err := p.env.Pool.Exec(ctx, `DROP SCHEMA `+sqlident.Quote(p.schema)+` CASCADE`)
	p.schema, p.client = "", nil
	return err
}
