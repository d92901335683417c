// Package demo is the workload behind `pgwake demo`: a mixed set of jobs
// (quick, slow, delayed, flaky, broken) pushed through a queue.Client at a
// given rate, a progress line while they run, and a summary of what
// happened (throughput, latency, retries, exactly-once effects, what woke
// the workers). cmd/pgwake wires it: the database, the metrics endpoint,
// flags and signals.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/backoff"
	"github.com/pgwake/pgwake/internal/promreg"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/queue"
)

// MaxAttempts is the demo's attempts per job; broken jobs fail all of them.
const MaxAttempts = 3

// retryBase is the demo's first retry delay; it doubles per attempt.
const retryBase = 250 * time.Millisecond

// ErrInterrupted is returned when ctx ends before the jobs all finished;
// the summary printed covers the jobs finished so far.
var ErrInterrupted = errors.New("interrupted; the summary above covers the jobs finished so far")

// Config is one demo run. Pool and Schema must name a migrated schema.
type Config struct {
	Pool        *pgxpool.Pool
	Schema      string
	Jobs        int           // jobs to enqueue
	Rate        float64       // jobs enqueued per second
	Concurrency int           // workers on queue default; critical gets half
	Timeout     time.Duration // give up when the jobs have not all finished by then
	Out         io.Writer     // progress and summary
	Logger      *zap.Logger
	Registry    *prometheus.Registry // the client's metrics; the summary reads its claim counters
}

// Run creates the demo's effects table in Schema, runs workers on queues
// default and critical, enqueues the workload, draws progress to Out until
// every job finished, and prints the summary.
func Run(ctx context.Context, cfg Config) error {
	if _, err := cfg.Pool.Exec(ctx, `CREATE TABLE `+sqlident.Quote(cfg.Schema, "demo_effects")+` (job_id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		return fmt.Errorf("create the demo's effects table: %w", err)
	}
	return (&demo{o: cfg, pool: cfg.Pool, schema: cfg.Schema, out: cfg.Out}).run(ctx)
}

type demo struct {
	o      Config
	pool   *pgxpool.Pool
	schema string
	out    io.Writer
	client *queue.Client

	latMu     sync.Mutex
	latencies []time.Duration // due -> handler start, first attempts of immediate jobs
	lateness  []time.Duration // the same for delayed jobs: run_after -> handler start
	attempts  atomic.Int64
}

func (d *demo) handler(kind string) queue.Handler {
	effects := sqlident.Quote(d.schema, "demo_effects")
	return queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job *queue.Job) error {
		if job.Attempt == 1 {
			lat := max(time.Since(job.RunAfter), 0)
			d.latMu.Lock()
			if kind == "reminder" {
				d.lateness = append(d.lateness, lat)
			} else {
				d.latencies = append(d.latencies, lat)
			}
			d.latMu.Unlock()
		}
		d.attempts.Add(1)
		work := 2*time.Millisecond + rand.N(6*time.Millisecond)
		if kind == "report" {
			work = 20*time.Millisecond + rand.N(30*time.Millisecond)
		}
		select {
		case <-time.After(work):
		case <-ctx.Done():
			return ctx.Err()
		}
		// The effect commits with the job's completion, or not at all.
		if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` (job_id) VALUES ($1)`, job.ID); err != nil {
			return err
		}
		switch kind {
		case "flaky":
			// Fails once, a third of them twice; then succeeds.
			if job.Attempt == 1 || (job.Attempt == 2 && job.ID%3 == 0) {
				return fmt.Errorf("flaky: upstream timed out (attempt %d)", job.Attempt)
			}
		case "broken":
			return errors.New("broken: the upstream rejects this request")
		}
		return nil
	})
}

// nextJob returns the i-th job of the mixed workload.
func nextJob(i int) queue.NewJob {
	r := rand.IntN(100)
	switch {
	case r < 55:
		return queue.NewJob{Kind: "email", Payload: map[string]any{"to": fmt.Sprintf("user%d@example.com", i)}}
	case r < 67:
		return queue.NewJob{Queue: "critical", Kind: "report", Priority: -1, Payload: map[string]any{"report": i}}
	case r < 82:
		return queue.NewJob{Kind: "reminder", Delay: time.Second + rand.N(4*time.Second), Payload: map[string]any{"n": i}}
	case r < 97:
		return queue.NewJob{Kind: "flaky", Payload: map[string]any{"n": i}}
	default:
		return queue.NewJob{Kind: "broken", Payload: map[string]any{"n": i}}
	}
}

func (d *demo) run(ctx context.Context) error {
	o, out := d.o, d.out
	client, err := d.newClient()
	if err != nil {
		return err
	}
	d.client = client

	// Workers stop when the jobs are done or on Ctrl-C.
	stop := startWorkers(ctx, client)
	defer func() { _ = stop() }()

	fmt.Fprintf(out, "pgwake demo: enqueuing %d jobs at ~%.0f/s on queues default and critical (workers: %d + %d)\n",
		o.Jobs, o.Rate, o.Concurrency, max(o.Concurrency/2, 1))

	start := time.Now()
	var enqueued atomic.Int64
	prodErr := make(chan error, 1)
	go func() { prodErr <- d.produce(ctx, start, &enqueued) }()

	w, err := d.watch(ctx, start, &enqueued, prodErr)
	if err != nil {
		return err
	}
	if err := stop(); err != nil {
		return err
	}
	if w.finishedAt.IsZero() {
		w.finishedAt = time.Now()
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	last := w.last
	if c, err := d.counts(sctx); err == nil {
		last = c
	}
	d.summary(sctx, o.Registry, last, w.finishedAt.Sub(start))
	switch {
	case w.interrupted:
		return ErrInterrupted
	case w.timedOut:
		return fmt.Errorf("the jobs did not all finish within --timeout %s", o.Timeout)
	}
	return nil
}

// newClient is the demo's client: workers on queues default and critical
// (half the workers), a handler per kind, doubling retries from retryBase.
func (d *demo) newClient() (*queue.Client, error) {
	o := d.o
	handlers := map[string]queue.Handler{}
	for _, k := range []string{"email", "report", "reminder", "flaky", "broken"} {
		handlers[k] = d.handler(k)
	}
	return queue.New(d.pool, queue.Config{
		Schema: d.schema,
		Queues: map[string]queue.QueueConfig{
			"default":  {MaxWorkers: o.Concurrency},
			"critical": {MaxWorkers: max(o.Concurrency/2, 1)},
		},
		Handlers:    handlers,
		Backoff:     func(attempt int) time.Duration { return backoff.Exponential(attempt, retryBase, 24*time.Hour) },
		MaxAttempts: MaxAttempts,
		Logger:      o.Logger,
		Registerer:  o.Registry,
	})
}

// startWorkers runs client until ctx ends or stop is called; stop (safe to
// call again) stops the workers and returns what Run returned.
func startWorkers(ctx context.Context, client *queue.Client) (stop func() error) {
	wctx, stopWorkers := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- client.Run(wctx) }()
	stopped := false
	return func() error {
		if stopped {
			return nil
		}
		stopped = true
		stopWorkers()
		return <-runErr
	}
}

// produce enqueues the workload: a small batch every tick, so jobs arrive
// while workers idle and the latency shows the NOTIFY wake-up rather than a
// backlog. It counts the jobs in enqueued and returns when all are in, ctx
// ended (nil) or an enqueue failed.
func (d *demo) produce(ctx context.Context, start time.Time, enqueued *atomic.Int64) error {
	o := d.o
	const tick = 20 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	i := 0
	for i < o.Jobs {
		want := min(o.Jobs, int(o.Rate*time.Since(start).Seconds())+1)
		if want > i {
			batch := make([]queue.NewJob, 0, want-i)
			for ; i < want; i++ {
				batch = append(batch, nextJob(i))
			}
			var err error
			if len(batch) == 1 {
				_, err = d.client.Enqueue(ctx, batch[0])
			} else {
				_, err = d.client.EnqueueMany(ctx, batch)
			}
			if err != nil {
				return err
			}
			enqueued.Add(int64(len(batch)))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
	return nil
}

// watched is how the progress watch ended.
type watched struct {
	last                  counts
	finishedAt            time.Time // zero unless every job finished
	interrupted, timedOut bool
}

// watch draws the progress until every job finished, ctx ends or the
// demo's timeout passes; an error when the producer failed or the progress
// could not be read.
func (d *demo) watch(ctx context.Context, start time.Time, enqueued *atomic.Int64, prodErr <-chan error) (watched, error) {
	o := d.o
	var w watched
	p := newProgress(d.out, o.Jobs)
	deadline := time.NewTimer(o.Timeout)
	defer deadline.Stop()
	producing := true
	for {
		if producing {
			select {
			case err := <-prodErr:
				producing = false
				if err != nil {
					p.clear()
					return w, fmt.Errorf("enqueue: %w", err)
				}
			default:
			}
		}
		c, err := d.counts(ctx)
		if err == nil {
			w.last = c
			p.draw(c, enqueued.Load(), time.Since(start))
			if !producing && c.finished() >= int64(o.Jobs) {
				w.finishedAt = time.Now()
				break
			}
		} else if ctx.Err() == nil {
			p.clear()
			return w, err
		}
		select {
		case <-ctx.Done():
			w.interrupted = true
		case <-deadline.C:
			w.timedOut = true
		case <-time.After(p.interval):
			continue
		}
		break
	}
	p.done(w.last, enqueued.Load(), time.Since(start))
	return w, nil
}

// counts is the demo schema's state.
type counts struct {
	succeeded, failed, pending, scheduled, running, retries, effects int64
}

func (c counts) finished() int64 { return c.succeeded + c.failed }

// counts reads the queues' counters through the read API, the outcomes
// from this process's metrics (the only worker on the demo's schema; an
// outcome is counted after its commit) and the effect rows from the demo's
// own table.
func (d *demo) counts(ctx context.Context) (counts, error) {
	var c counts
	st, err := d.client.QueueStats(ctx, queue.QueueStatsParams{})
	if err != nil {
		return c, fmt.Errorf("read progress: %w", err)
	}
	for _, s := range st {
		c.pending, c.scheduled, c.running = c.pending+s.Pending, c.scheduled+s.Scheduled, c.running+s.Running
	}
	outcomes, err := promreg.SumBy(d.o.Registry, "pgwake_worker_jobs_total", "outcome")
	if err != nil {
		return c, fmt.Errorf("read progress: %w", err)
	}
	c.succeeded, c.failed, c.retries = int64(outcomes["succeeded"]), int64(outcomes["failed"]), int64(outcomes["retry"])
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM `+sqlident.Quote(d.schema, "demo_effects")).Scan(&c.effects); err != nil {
		return c, fmt.Errorf("read progress: %w", err)
	}
	return c, nil
}

// progress draws a one-line bar: redrawn in place on a terminal, a new line
// every few seconds otherwise (logs, CI, pipes).
type progress struct {
	w        io.Writer
	total    int
	tty      bool
	interval time.Duration
	lastLine time.Time
	width    int
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, interval: 200 * time.Millisecond}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) line(c counts, enqueued int64, elapsed time.Duration) string {
	const barWidth = 30
	fin := c.finished()
	n := int(float64(barWidth) * float64(fin) / float64(p.total))
	bar := strings.Repeat("#", n) + strings.Repeat(".", barWidth-n)
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(fin) / s
	}
	return fmt.Sprintf("[%s] %d/%d done  enqueued %d  running %d  waiting %d  scheduled %d  retries %d  failed %d  %.0f jobs/s  %4.1fs",
		bar, fin, p.total, enqueued, c.running, c.pending, c.scheduled, c.retries, c.failed, rate, elapsed.Seconds())
}

func (p *progress) draw(c counts, enqueued int64, elapsed time.Duration) {
	s := p.line(c, enqueued, elapsed)
	if p.tty {
		pad := max(p.width-len(s), 0)
		fmt.Fprintf(p.w, "\r%s%s", s, strings.Repeat(" ", pad))
		p.width = len(s)
		return
	}
	if time.Since(p.lastLine) >= 2*time.Second {
		fmt.Fprintln(p.w, s)
		p.lastLine = time.Now()
	}
}

func (p *progress) done(c counts, enqueued int64, elapsed time.Duration) {
	s := p.line(c, enqueued, elapsed)
	if p.tty {
		pad := max(p.width-len(s), 0)
		fmt.Fprintf(p.w, "\r%s%s\n", s, strings.Repeat(" ", pad))
		return
	}
	fmt.Fprintln(p.w, s)
}

func (p *progress) clear() {
	if p.tty && p.width > 0 {
		fmt.Fprintln(p.w)
	}
}

func (d *demo) summary(ctx context.Context, reg *prometheus.Registry, c counts, elapsed time.Duration) {
	w := d.out
	fin := c.finished()
	fmt.Fprintf(w, "\nSummary\n")
	fmt.Fprintf(w, "  jobs            %d finished in %s: %.0f jobs/s (offered load ~%.0f/s; `make bench` measures the ceiling)\n",
		fin, elapsed.Round(10*time.Millisecond), float64(fin)/max(elapsed.Seconds(), 1e-9), d.o.Rate)
	fmt.Fprintf(w, "  outcomes        %d succeeded, %d failed after %d attempts, %d retries scheduled, %d handler runs\n",
		c.succeeded, c.failed, MaxAttempts, c.retries, d.attempts.Load())
	verdict := "exactly once"
	if c.effects != c.succeeded {
		verdict = "MISMATCH"
	}
	fmt.Fprintf(w, "  effects         %d rows written in claim transactions for %d succeeded jobs: %s (failed attempts' writes rolled back)\n",
		c.effects, c.succeeded, verdict)

	d.latMu.Lock()
	lat := append([]time.Duration(nil), d.latencies...)
	late := append([]time.Duration(nil), d.lateness...)
	d.latMu.Unlock()
	fmt.Fprintf(w, "\n  latency, enqueue to handler start (first attempts of immediate jobs, n=%d)\n", len(lat))
	writeLatency(w, lat, true)
	fmt.Fprintf(w, "\n  lateness of delayed jobs, run_after to handler start (n=%d)\n", len(late))
	writeLatency(w, late, false)

	claims, _ := promreg.SumBy(reg, "pgwake_worker_claims_total", "source") // no table on error
	fmt.Fprintf(w, "\n  claims by what made the worker look\n")
	explain := map[string]string{
		"notify":    "a NOTIFY from the enqueue woke an idle worker",
		"busy":      "the worker looked again right after a job (backlog)",
		"scheduled": "the worker's timer for a delayed job or retry fired",
		"poll":      "the poll fallback (notifications missed)",
		"start":     "first look after start",
		"resync":    "the listener (re)connected",
		"released":  "a claim of this process was lost, or handed jobs back unstarted",
		"recovered": "an attempt that began and recorded no outcome (run again, or counted)",
		"recheck":   "a short second look while a producer may have skipped its NOTIFY",
	}
	var total float64
	for _, v := range claims {
		total += v
	}
	order := []string{"notify", "busy", "scheduled", "poll", "start", "resync", "released", "recovered", "recheck"}
	var extra []string
	for src := range claims {
		if !slices.Contains(order, src) {
			extra = append(extra, src)
		}
	}
	sort.Strings(extra)
	for _, src := range append(order, extra...) {
		v := claims[src]
		pct := 0.0
		if total > 0 {
			pct = 100 * v / total
		}
		fmt.Fprintf(w, "    %-10s %6.0f  %5.1f%%  %s\n", src, v, pct, explain[src])
	}
}

// writeLatency prints percentiles and, with hist, a histogram.
func writeLatency(w io.Writer, lat []time.Duration, hist bool) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Fprintf(w, "    p50 %s   p90 %s   p99 %s   max %s\n",
		fmtLatency(percentile(lat, 0.50)), fmtLatency(percentile(lat, 0.90)), fmtLatency(percentile(lat, 0.99)), fmtLatency(lat[len(lat)-1]))
	if hist {
		writeHistogram(w, lat)
	}
}

// percentile of sorted values (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func fmtLatency(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dus", d.Microseconds())
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// writeHistogram prints a small text histogram on 1-2-5 buckets.
func writeHistogram(w io.Writer, sorted []time.Duration) {
	bounds := []time.Duration{}
	for b := 500 * time.Microsecond; b < 10*time.Second; {
		bounds = append(bounds, b)
		switch s := fmt.Sprint(b)[0]; s {
		case '1':
			b *= 2
		case '2':
			b = b * 5 / 2
		default:
			b *= 2
		}
	}
	counts := make([]int, len(bounds)+1)
	for _, v := range sorted {
		i := sort.Search(len(bounds), func(i int) bool { return v < bounds[i] })
		counts[i]++
	}
	first, lastIdx := -1, -1
	maxCount := 0
	for i, n := range counts {
		if n > 0 {
			if first < 0 {
				first = i
			}
			lastIdx = i
			maxCount = max(maxCount, n)
		}
	}
	if first < 0 {
		return
	}
	const width = 40
	for i := first; i <= lastIdx; i++ {
		var label string
		switch {
		case i == 0:
			label = "< " + fmtLatency(bounds[0])
		case i == len(bounds):
			label = ">= " + fmtLatency(bounds[i-1])
		default:
			label = fmtLatency(bounds[i-1]) + "-" + fmtLatency(bounds[i])
		}
		n := counts[i]
		bar := int(math.Ceil(float64(width) * float64(n) / float64(maxCount)))
		if n == 0 {
			bar = 0
		}
		fmt.Fprintf(w, "    %-13s %-*s %d\n", label, width, strings.Repeat("#", bar), n)
	}
}
