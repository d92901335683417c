package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/pgwake/pgwake/bench/harness"
)

// riverSystem is River (riverpgxv5) as a harness.System: one queue
// ("default", MaxWorkers = the bench's --workers, as pgwake's, unless
// --river-workers says otherwise), one no-op worker, and
// either River's defaults or, when tuned, FetchCooldown 1ms and
// FetchPollInterval 50ms. Each Setup migrates a fresh schema with
// rivermigrate.
type riverSystem struct {
	tuned   bool
	workers int // MaxWorkers; 0 means the bench's --workers

	env    *harness.Env
	schema string
	client *river.Client[pgx.Tx]
	handle atomic.Pointer[harness.HandleFunc]
	n      int
}

func (r *riverSystem) Name() string {
	if r.tuned {
		return "river-tuned"
	}
	return "river-default"
}

func (r *riverSystem) Config() string {
	s := fmt.Sprintf("River %s riverpgxv5; Queues{default: MaxWorkers=%s}; one no-op worker", riverVersion, r.maxWorkersText())
	if r.tuned {
		return s + "; FetchCooldown 1ms, FetchPollInterval 50ms"
	}
	return s + "; defaults (FetchCooldown 100ms, FetchPollInterval 1s)"
}

// Supports every mode but scale (a River drain of a large backlog at its
// default settings takes minutes; scale is pgwake against itself).
func (r *riverSystem) Supports(m harness.Mode) bool { return m != harness.ModeScale }

type benchArgs struct {
	Seq     int64 `json:"seq"`
	SleepMS int64 `json:"sleep_ms,omitempty"`
}

func (benchArgs) Kind() string { return "bench" }

type benchWorker struct {
	river.WorkerDefaults[benchArgs]
	sys *riverSystem
}

func (w *benchWorker) Work(ctx context.Context, job *river.Job[benchArgs]) error {
	if h := w.sys.handle.Load(); h != nil {
		(*h)(job.Args.Seq)
	}
	if job.Args.SleepMS > 0 {
		select {
		case <-time.After(time.Duration(job.Args.SleepMS) * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *riverSystem) Setup(ctx context.Context, env *harness.Env) error {
	r.env = env
	r.n++
	r.schema = fmt.Sprintf("river_bench_%d_%d", time.Now().UnixNano()%1e9, r.n)
	if _, err := env.Pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{r.schema}.Sanitize()); err != nil {
		return err
	}
	driver := riverpgxv5.New(env.Pool)
	m, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: r.schema, Logger: quietLogger()})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &benchWorker{sys: r})
	cfg := &river.Config{
		Schema:  r.schema,
		Logger:  quietLogger(),
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: r.maxWorkers()}},
		Workers: workers,
	}
	if r.tuned {
		cfg.FetchCooldown = time.Millisecond
		cfg.FetchPollInterval = 50 * time.Millisecond
	}
	r.client, err = river.NewClient(driver, cfg)
	return err
}

// Settle vacuums and analyzes river_job and checkpoints, as pgwake's
// Settle does for its tables, so that no autovacuum of the scheduled mode's
// bulk insert runs during River's measurement either.
func (r *riverSystem) Settle(ctx context.Context) error {
	if _, err := r.env.Pool.Exec(ctx, `VACUUM ANALYZE `+pgx.Identifier{r.schema, "river_job"}.Sanitize()); err != nil {
		return err
	}
	_, _ = r.env.Pool.Exec(ctx, "CHECKPOINT")
	return nil
}

func (r *riverSystem) maxWorkers() int {
	// The concurrent mode's Workers (thousands) is above any --river-workers.
	return max(r.workers, r.env.Workers)
}

func (r *riverSystem) maxWorkersText() string {
	if r.workers > 0 {
		return fmt.Sprint(r.workers)
	}
	return "workers"
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func insertOpts(j harness.Job) *river.InsertOpts {
	if j.RunAt.IsZero() {
		return nil
	}
	return &river.InsertOpts{ScheduledAt: j.RunAt}
}

// InsertMany uses InsertManyFast (COPY).
func (r *riverSystem) InsertMany(ctx context.Context, jobs []harness.Job) error {
	ps := make([]river.InsertManyParams, len(jobs))
	for i, j := range jobs {
		ps[i] = river.InsertManyParams{Args: benchArgs{Seq: j.Seq, SleepMS: j.Sleep.Milliseconds()}, InsertOpts: insertOpts(j)}
	}
	_, err := r.client.InsertManyFast(ctx, ps)
	return err
}

// Enqueue uses Insert (its own transaction).
func (r *riverSystem) Enqueue(ctx context.Context, j harness.Job) error {
	_, err := r.client.Insert(ctx, benchArgs{Seq: j.Seq, SleepMS: j.Sleep.Milliseconds()}, insertOpts(j))
	return err
}

func (r *riverSystem) Start(ctx context.Context, handle harness.HandleFunc) (func() error, error) {
	r.handle.Store(&handle)
	if err := r.client.Start(ctx); err != nil {
		return nil, err
	}
	var stopped atomic.Bool
	return func() error {
		if !stopped.CompareAndSwap(false, true) {
			return nil
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		return r.client.Stop(sctx)
	}, nil
}

// Unfinished counts jobs not yet completed, discarded or cancelled.
func (r *riverSystem) Unfinished(ctx context.Context) (int64, error) {
	var n int64
	err := r.env.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{r.schema, "river_job"}.Sanitize()+
		` WHERE state NOT IN ('completed', 'discarded', 'cancelled')`).Scan(&n)
	return n, err
}

func (r *riverSystem) Teardown(ctx context.Context) error {
	if r.schema == "" {
		return nil
	}
	_, err := r.env.Pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{r.schema}.Sanitize()+` CASCADE`)
	r.schema, r.client = "", nil
	return err
}
