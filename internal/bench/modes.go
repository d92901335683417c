package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/queue"
)

// Sizes are the modes' parameters. The zero value of a field means its
// default (see DefaultSizes).
type Sizes struct {
	// DrainJobs is how many jobs drain pre-inserts. Default 10,000.
	DrainJobs int
	// Rate is the latency mode's jobs per second. Default 200.
	Rate float64
	// LatencyDuration is how long the latency mode produces. Default 10s.
	LatencyDuration time.Duration
	// IdleInterval is the gap between idle-mode jobs. Default 500ms.
	IdleInterval time.Duration
	// IdleDuration is how long the idle mode produces. Default 10s.
	IdleDuration time.Duration
	// DelayedJobs is how many delayed jobs the delayed mode inserts.
	// Default 200.
	DelayedJobs int
	// DelayedSpread is the span their run_after times cover, starting 1s
	// after the insert. Default 10s.
	DelayedSpread time.Duration
	// Producers is the enqueue mode's concurrency. Default 16.
	Producers int
	// LatencyProducers is how many producers share the latency modes'
	// jobs (one job per transaction each, job i due at i/Rate). Default
	// max(4, ceil(Rate/250)): 4 up to 1,000 jobs/s, as in every figure
	// before it existed, and more above, where 4 producers each waiting
	// for its commit's WAL flush cannot reach the rate (at 3,000 jobs/s
	// they reached 781-1,542 for pgwake and River alike).
	LatencyProducers int
	// EnqueueDuration is the enqueue mode's total time, half of it on the
	// baseline, alternating in two rounds. Default 10s.
	EnqueueDuration time.Duration
	// ScaleSmall and ScaleLarge are the scale mode's backlogs; ScaleFinished
	// is how many finished jobs it leaves in the table for its third case.
	// Defaults 10,000, 100,000 and 100,000 (the targets name 1M: pass
	// 1000000 for those runs). A negative ScaleFinished skips the third case.
	ScaleSmall, ScaleLarge, ScaleFinished int
	// BatchSize is how many jobs one InsertMany call carries. Default 5,000.
	BatchSize int
	// IdleTimeout gives up waiting for handlers when no new job has started
	// for this long. Default 60s.
	IdleTimeout time.Duration
	// ConcurrentJobs jobs that each sleep ConcurrentSleep, all allowed to
	// run at once, on a pool of its own with ConcurrentPool connections: the
	// concurrent mode. Defaults 5,000, 2s and 20.
	ConcurrentJobs  int
	ConcurrentSleep time.Duration
	ConcurrentPool  int
	// ConcurrentLease, when not zero, is the concurrent mode's lease for a
	// leasing system (Env.LeaseDuration): a short one makes the heartbeat
	// run during the jobs, to measure its load. Default 0, the system's own.
	ConcurrentLease time.Duration
	// StreamJobs is how many jobs the stream mode drains. Default 50,000.
	StreamJobs int
	// ScheduledJobs is how many jobs the scheduled mode's second case
	// schedules 1 hour to 7 days ahead in the bench queue before the
	// latency run. Default 300,000.
	ScheduledJobs int
	// ScheduledFailed is how many failed jobs, kept by retention, the
	// scheduled mode's third case adds to the second's backlog (systems
	// that implement FailedKeeper). Default 300,000; negative skips the
	// case.
	ScheduledFailed int
	// HousekeepingSmall and HousekeepingLarge are the finished jobs (and
	// events) the housekeeping mode keeps in its two cases;
	// HousekeepingExpired is how many of each expire. Defaults 100,000,
	// 1,000,000 and 20,000.
	HousekeepingSmall, HousekeepingLarge, HousekeepingExpired int
	// QueuesJobs is how many jobs, each in a queue of its own, the queues
	// mode enqueues in one call. Default 100,000.
	QueuesJobs int
}

// DefaultSizes returns the defaults, sized so that `make bench` finishes in
// a few minutes on a 2-core machine.
func DefaultSizes() Sizes { return Sizes{}.withDefaults() }

func (s Sizes) withDefaults() Sizes {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&s.DrainJobs, 10000)
	if s.Rate == 0 {
		s.Rate = 200
	}
	defD(&s.LatencyDuration, 10*time.Second)
	defD(&s.IdleInterval, 500*time.Millisecond)
	defD(&s.IdleDuration, 10*time.Second)
	def(&s.DelayedJobs, 200)
	defD(&s.DelayedSpread, 10*time.Second)
	def(&s.Producers, 16)
	def(&s.LatencyProducers, max(4, int(math.Ceil(s.Rate/250))))
	defD(&s.EnqueueDuration, 10*time.Second)
	def(&s.ScaleSmall, 10000)
	def(&s.ScaleLarge, 100000)
	def(&s.ScaleFinished, 100000)
	def(&s.BatchSize, 5000)
	defD(&s.IdleTimeout, 60*time.Second)
	def(&s.ConcurrentJobs, 5000)
	defD(&s.ConcurrentSleep, 2*time.Second)
	def(&s.ConcurrentPool, 20)
	def(&s.StreamJobs, 50000)
	def(&s.ScheduledJobs, 300000)
	def(&s.ScheduledFailed, 300000)
	def(&s.HousekeepingSmall, 100000)
	def(&s.HousekeepingLarge, 1000000)
	def(&s.HousekeepingExpired, 20000)
	def(&s.QueuesJobs, 100000)
	return s
}

// ErrInvalidSizes is wrapped by errors for sizes out of range.
var ErrInvalidSizes = errors.New("invalid bench sizes")

func (s Sizes) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidSizes, fmt.Sprintf(format, args...))
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"drain jobs", s.DrainJobs}, {"delayed jobs", s.DelayedJobs}, {"producers", s.Producers}, {"latency producers", s.LatencyProducers},
		{"scale small", s.ScaleSmall}, {"scale large", s.ScaleLarge}, {"batch size", s.BatchSize},
		{"concurrent jobs", s.ConcurrentJobs}, {"concurrent pool", s.ConcurrentPool}, {"stream jobs", s.StreamJobs},
		{"scheduled jobs", s.ScheduledJobs}, {"housekeeping small", s.HousekeepingSmall},
		{"housekeeping large", s.HousekeepingLarge}, {"housekeeping expired", s.HousekeepingExpired},
		{"queues jobs", s.QueuesJobs}} {
		if c.v < 1 {
			return bad("%s must be at least 1, got %d", c.name, c.v)
		}
	}
	if s.Rate <= 0 || s.Rate > 100000 || math.IsNaN(s.Rate) {
		return bad("rate must be in (0, 100000] jobs/s, got %v", s.Rate)
	}
	for _, c := range []struct {
		name string
		v    time.Duration
	}{{"latency duration", s.LatencyDuration}, {"idle interval", s.IdleInterval}, {"idle duration", s.IdleDuration},
		{"delayed spread", s.DelayedSpread}, {"enqueue duration", s.EnqueueDuration}, {"idle timeout", s.IdleTimeout},
		{"concurrent sleep", s.ConcurrentSleep}} {
		if c.v <= 0 {
			return bad("%s must be positive, got %s", c.name, c.v)
		}
	}
	if s.ConcurrentLease != 0 && s.ConcurrentLease < queue.MinLeaseDuration {
		return bad("concurrent lease must be 0 (the default) or at least %s, got %s", queue.MinLeaseDuration, s.ConcurrentLease)
	}
	if s.IdleDuration < s.IdleInterval {
		return bad("idle duration %s is shorter than the idle interval %s", s.IdleDuration, s.IdleInterval)
	}
	return nil
}

// runner runs modes of one system.
type runner struct {
	sys   System
	env   *Env
	sizes Sizes
	logf  func(format string, args ...any)
}

// run runs one mode and returns its results (several for scale). Setup and
// Teardown happen around each case.
func (rn *runner) run(ctx context.Context, mode Mode) ([]Result, error) {
	switch mode {
	case ModeDrain:
		r, err := rn.drain(ctx, rn.sizes.DrainJobs, 0)
		return []Result{r}, err
	case ModeLatency:
		r, err := rn.latency(ctx, ModeLatency, rn.sizes.Rate, rn.sizes.LatencyDuration, nil)
		return []Result{r}, err
	case ModeIdle:
		rate := float64(time.Second) / float64(rn.sizes.IdleInterval)
		r, err := rn.latency(ctx, ModeIdle, rate, rn.sizes.IdleDuration, nil)
		return []Result{r}, err
	case ModeDelayed:
		r, err := rn.delayed(ctx)
		return []Result{r}, err
	case ModeEnqueue:
		r, err := rn.enqueue(ctx)
		return []Result{r}, err
	case ModeScale:
		return rn.scale(ctx)
	case ModeConcurrent:
		r, err := rn.concurrent(ctx)
		return []Result{r}, err
	case ModeScheduled:
		return rn.scheduled(ctx)
	case ModeHousekeeping:
		return rn.housekeeping(ctx)
	case ModeQueues:
		return rn.queues(ctx)
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownMode, mode)
}

// fresh runs Setup, f and Teardown, and a CHECKPOINT first so that one
// case's WAL is not flushed during the next.
func (rn *runner) fresh(ctx context.Context, f func() error) (err error) {
	checkpoint(ctx, rn.env.Pool)
	if err := rn.sys.Setup(ctx, rn.env); err != nil {
		return fmt.Errorf("%s: setup: %w", rn.sys.Name(), err)
	}
	defer func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if terr := rn.sys.Teardown(tctx); terr != nil && err == nil {
			err = fmt.Errorf("%s: teardown: %w", rn.sys.Name(), terr)
		}
	}()
	return f()
}

// walStats reads how many times the cluster synced its WAL to disk and how
// many WAL bytes it wrote so far (pg_stat_wal). Processes report these at
// most once a second and when they exit, so the difference over a run is
// approximate. ok is false when they cannot be read.
func walStats(ctx context.Context, pool *pgxpool.Pool) (syncs, bytes float64, ok bool) {
	err := pool.QueryRow(ctx, `SELECT wal_sync::float8, wal_bytes::float8 FROM pg_stat_wal`).Scan(&syncs, &bytes)
	return syncs, bytes, err == nil
}

// checkpoint asks for a CHECKPOINT; without the privilege it does nothing.
func checkpoint(ctx context.Context, pool *pgxpool.Pool) {
	_, _ = pool.Exec(ctx, "CHECKPOINT")
}

func (rn *runner) insert(ctx context.Context, n int, runAt func(i int) time.Time) error {
	return rn.insertSleeping(ctx, n, runAt, 0)
}

// insertSleeping inserts n jobs whose handlers sleep for sleep.
func (rn *runner) insertSleeping(ctx context.Context, n int, runAt func(i int) time.Time, sleep time.Duration) error {
	for from := 0; from < n; from += rn.sizes.BatchSize {
		to := min(from+rn.sizes.BatchSize, n)
		jobs := make([]Job, 0, to-from)
		for i := from; i < to; i++ {
			j := Job{Seq: int64(i), Sleep: sleep}
			if runAt != nil {
				j.RunAt = runAt(i)
			}
			jobs = append(jobs, j)
		}
		if err := rn.sys.InsertMany(ctx, jobs); err != nil {
			return fmt.Errorf("%s: insert jobs %d..%d: %w", rn.sys.Name(), from, to-1, err)
		}
	}
	return nil
}

// drain pre-inserts n jobs (after finished finished ones), starts the
// workers and times them until every job has started and, where the system
// can count, none is unfinished.
func (rn *runner) drain(ctx context.Context, n, finished int) (Result, error) {
	res := Result{Mode: ModeDrain, System: rn.sys.Name(), Jobs: n, Extra: map[string]float64{}}
	noLatency(&res)
	err := rn.fresh(ctx, func() error {
		if finished > 0 {
			f, ok := rn.sys.(Finisher)
			if !ok {
				return fmt.Errorf("%s cannot insert finished jobs", rn.sys.Name())
			}
			rn.logf("%s: inserting %d finished jobs", rn.sys.Name(), finished)
			if err := f.InsertFinished(ctx, finished); err != nil {
				return fmt.Errorf("%s: insert finished jobs: %w", rn.sys.Name(), err)
			}
		}
		rn.logf("%s: inserting %d jobs", rn.sys.Name(), n)
		t := time.Now()
		if err := rn.insert(ctx, n, nil); err != nil {
			return err
		}
		res.Extra["insert_per_sec"] = float64(n) / time.Since(t).Seconds()
		checkpoint(ctx, rn.env.Pool)

		rn.logf("%s: draining %d jobs", rn.sys.Name(), n)
		mem := startMemSampler()
		base := time.Now()
		rec := newRecorder(n, base)
		stop, err := rn.sys.Start(ctx, rec.handle)
		if err != nil {
			mem.stop()
			return fmt.Errorf("%s: start workers: %w", rn.sys.Name(), err)
		}
		res.Extra["start_ms"] = ms(time.Since(base))
		elapsed, err := rn.untilFinished(ctx, rec, base, rn.sizes.IdleTimeout, 0, &res)
		if err != nil {
			_ = stop()
			mem.stop()
			return err
		}
		first, _ := rec.startSpan()
		res.Extra["first_start_ms"] = ms(first)
		serr := stop()
		rn.diagnose(&res)
		rss, heap := mem.stop()
		res.Extra["max_rss_mib"] = rss
		res.Extra["max_heap_mib"] = heap
		res.Duplicates, res.Missing = rec.tally()
		res.JobsPerSec = float64(n-int(res.Missing)) / elapsed.Seconds()
		res.Extra["seconds"] = elapsed.Seconds()
		if serr != nil {
			return fmt.Errorf("%s: stop workers: %w", rn.sys.Name(), serr)
		}
		return ctx.Err()
	})
	return res, err
}

// latency produces one job per transaction at rate for d and measures
// enqueue-commit to handler start. prepare, if set, runs in the fresh
// tables before the workers start.
func (rn *runner) latency(ctx context.Context, mode Mode, rate float64, d time.Duration, prepare func() error) (Result, error) {
	n := max(int(math.Round(rate*d.Seconds())), 1)
	p := rn.sizes.LatencyProducers
	res := Result{Mode: mode, System: rn.sys.Name(), Jobs: n, Extra: map[string]float64{"rate": rate, "producers": float64(p)}}
	noLatency(&res)
	err := rn.fresh(ctx, func() error {
		if prepare != nil {
			if err := prepare(); err != nil {
				return err
			}
			checkpoint(ctx, rn.env.Pool)
		}
		base := time.Now()
		rec := newRecorder(n, base)
		stop, err := rn.sys.Start(ctx, rec.handle)
		if err != nil {
			return fmt.Errorf("%s: start workers: %w", rn.sys.Name(), err)
		}
		defer func() { _ = stop() }()
		// Let the workers settle (connect, LISTEN, first empty look).
		if !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
		rn.logf("%s: %s: %d jobs at %.0f/s, %d producers", rn.sys.Name(), mode, n, rate, p)
		commits := make([]atomic.Int64, n)
		syncs0, bytes0, walOK := walStats(ctx, rn.env.Pool)
		pool0 := rn.env.Pool.Stat()
		t0 := time.Since(base)
		calls := make([]atomic.Int64, n)
		cpu0 := sampleCPU()
		enqLat, perr := produceAtRate(ctx, rn.sys, p, n, rate, base, calls, commits)
		produced := time.Since(base) - t0
		all := rec.wait(rn.sizes.IdleTimeout, ctx.Done())
		cpuStats(res.Extra, cpu0, sampleCPU(), n)
		poolStats(res.Extra, pool0, rn.env.Pool.Stat(), n)
		if all {
			// Let a late duplicate show.
			sleepCtx(ctx, 200*time.Millisecond)
		}
		serr := stop()
		if syncs1, bytes1, ok := walStats(ctx, rn.env.Pool); ok && walOK {
			res.Extra["wal_syncs_per_job"] = (syncs1 - syncs0) / float64(n)
			res.Extra["wal_bytes_per_job"] = (bytes1 - bytes0) / float64(n)
		}
		rn.diagnose(&res)
		es := Summarize(enqLat)
		res.Extra["enqueue_p50_ms"], res.Extra["enqueue_p99_ms"] = es.P50, es.P99
		res.Duplicates, res.Missing = rec.tally()
		latencies(&res, rec, calls, commits)
		res.JobsPerSec = float64(n) / produced.Seconds()
		if perr != nil {
			return perr
		}
		if serr != nil {
			return fmt.Errorf("%s: stop workers: %w", rn.sys.Name(), serr)
		}
		return ctx.Err()
	})
	return res, err
}

// latencies sets res's latency statistics and samples (enqueue commit to
// handler start), first_ms, min_ms and the from-call percentiles (the
// producer's call to handler start).
func latencies(res *Result, rec *recorder, calls, commits []atomic.Int64) {
	var lat, fromCall []float64
	for i := range commits {
		c := commits[i].Load()
		s, ok := rec.startedAt(i)
		if c == 0 || !ok {
			continue
		}
		lat = append(lat, ms(s-time.Duration(c)))
		fromCall = append(fromCall, ms(s-time.Duration(calls[i].Load())))
		if i == 0 {
			// The first job after the workers started: what a start
			// left unprepared shows here.
			res.Extra["first_ms"] = lat[0]
		}
	}
	// From the producer's call to the handler's start: what the
	// producer's own commit costs counts too.
	cs := Summarize(fromCall)
	res.Extra["from_call_p50_ms"], res.Extra["from_call_p99_ms"] = cs.P50, cs.P99
	st := Summarize(lat)
	res.withStats(st)
	res.Samples = lat
	res.Extra["min_ms"] = st.Min
}

// poolStats adds to extra what the shared pool's acquires cost between two
// of its Stats, per job: pool_acquires_per_job, pool_empty_acquires_per_job
// (acquires that found no idle connection) and pool_empty_wait_us_per_job
// (the time those waited). The bench and the system under test share the
// pool, so a system that holds more connections makes the producers wait
// too.
func poolStats(extra map[string]float64, a, b *pgxpool.Stat, n int) {
	jobs := float64(n)
	extra["pool_acquires_per_job"] = float64(b.AcquireCount()-a.AcquireCount()) / jobs
	extra["pool_empty_acquires_per_job"] = float64(b.EmptyAcquireCount()-a.EmptyAcquireCount()) / jobs
	extra["pool_empty_wait_us_per_job"] = float64((b.EmptyAcquireWaitTime() - a.EmptyAcquireWaitTime()).Microseconds()) / jobs
	extra["pool_new_conns"] = float64(b.NewConnsCount() - a.NewConnsCount())
	extra["pool_empty_acquires"] = float64(b.EmptyAcquireCount() - a.EmptyAcquireCount())
}

// diagnose adds the system's diagnostics to res's extras.
func (rn *runner) diagnose(res *Result) {
	if d, ok := rn.sys.(Diagnoser); ok {
		for k, v := range d.Diagnostics() {
			res.Extra[k] = v
		}
	}
}

// produceAtRate enqueues jobs 0..n-1, job i at base-relative time i/rate
// from now, with producers concurrent producers so one slow commit does not
// delay the next job. commits[i] gets the time since base just after job
// i's commit. It returns the Enqueue calls' latencies (ms).
func produceAtRate(ctx context.Context, sys System, producers, n int, rate float64, base time.Time, calls, commits []atomic.Int64) ([]float64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan int)
	var wg sync.WaitGroup
	lats := make([][]float64, producers)
	for w := range producers {
		wg.Go(func() {
			for i := range jobs {
				t := time.Now()
				if calls != nil {
					calls[i].Store(max(int64(t.Sub(base)), 1))
				}
				if err := sys.Enqueue(ctx, Job{Seq: int64(i)}); err != nil {
					cancel(fmt.Errorf("%s: enqueue job %d: %w", sys.Name(), i, err))
					continue
				}
				commits[i].Store(max(int64(time.Since(base)), 1))
				lats[w] = append(lats[w], ms(time.Since(t)))
			}
		})
	}
	start := time.Now()
	interval := float64(time.Second) / rate
feed:
	for i := range n {
		at := start.Add(time.Duration(float64(i) * interval))
		if d := time.Until(at); d > 0 && !sleepCtx(ctx, d) {
			break
		}
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	var all []float64
	for _, l := range lats {
		all = append(all, l...)
	}
	return all, context.Cause(ctx)
}

// delayed inserts jobs with run_after spread over DelayedSpread while the
// workers run, and measures handler start against run_after.
func (rn *runner) delayed(ctx context.Context) (Result, error) {
	n := rn.sizes.DelayedJobs
	spread := rn.sizes.DelayedSpread
	res := Result{Mode: ModeDelayed, System: rn.sys.Name(), Jobs: n, Extra: map[string]float64{}}
	noLatency(&res)
	err := rn.fresh(ctx, func() error {
		base := time.Now()
		rec := newRecorder(n, base)
		stop, err := rn.sys.Start(ctx, rec.handle)
		if err != nil {
			return fmt.Errorf("%s: start workers: %w", rn.sys.Name(), err)
		}
		defer func() { _ = stop() }()
		if !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
		rn.logf("%s: delayed: %d jobs due over %s", rn.sys.Name(), n, spread)
		first := time.Since(base) + time.Second
		due := func(i int) time.Duration {
			return first + time.Duration(float64(spread)*float64(i)/float64(n))
		}
		// RunAt is wall time for the database; due(i) the same instant on
		// the monotonic clock the recorder uses.
		wall := base.Round(0)
		if err := rn.insert(ctx, n, func(i int) time.Time { return wall.Add(due(i)) }); err != nil {
			return err
		}
		all := rec.wait(spread+rn.sizes.IdleTimeout, ctx.Done())
		if all {
			sleepCtx(ctx, 200*time.Millisecond)
		}
		serr := stop()
		rn.diagnose(&res)
		res.Duplicates, res.Missing = rec.tally()
		var late []float64
		early := 0
		for i := range n {
			s, ok := rec.startedAt(i)
			if !ok {
				continue
			}
			l := ms(s - due(i))
			if l < 0 {
				early++
			}
			late = append(late, l)
		}
		st := Summarize(late)
		res.withStats(st)
		res.Samples = late
		res.Extra["min_ms"] = st.Min
		res.Extra["early"] = float64(early)
		res.JobsPerSec = float64(n) / spread.Seconds()
		if serr != nil {
			return fmt.Errorf("%s: stop workers: %w", rn.sys.Name(), serr)
		}
		return ctx.Err()
	})
	return res, err
}

// enqueue measures Producers concurrent one-job transactions against the
// same producers each inserting one row into a plain table, alternating
// baseline and system in two rounds of EnqueueDuration/4 each.
func (rn *runner) enqueue(ctx context.Context) (Result, error) {
	p := rn.sizes.Producers
	res := Result{Mode: ModeEnqueue, System: rn.sys.Name(), Extra: map[string]float64{"producers": float64(p)}}
	noLatency(&res)
	err := rn.fresh(ctx, func() error {
		bl, err := newBaseline(ctx, rn.env.Pool)
		if err != nil {
			return err
		}
		defer bl.drop(context.WithoutCancel(ctx))
		phase := rn.sizes.EnqueueDuration / 4
		var seq atomic.Int64
		var sysN, baseN int64
		var sysT, baseT time.Duration
		var sysLat, baseLat []float64
		for round := range 2 {
			rn.logf("%s: enqueue round %d: baseline then %s, %d producers, %s each", rn.sys.Name(), round+1, rn.sys.Name(), p, phase)
			n, t, lat, err := closedLoop(ctx, p, phase, func(ctx context.Context) error { return bl.insert(ctx) })
			if err != nil {
				return fmt.Errorf("baseline insert: %w", err)
			}
			baseN, baseT, baseLat = baseN+n, baseT+t, append(baseLat, lat...)
			checkpoint(ctx, rn.env.Pool)
			n, t, lat, err = closedLoop(ctx, p, phase, func(ctx context.Context) error {
				return rn.sys.Enqueue(ctx, Job{Seq: seq.Add(1) - 1})
			})
			if err != nil {
				return fmt.Errorf("%s: enqueue: %w", rn.sys.Name(), err)
			}
			sysN, sysT, sysLat = sysN+n, sysT+t, append(sysLat, lat...)
			checkpoint(ctx, rn.env.Pool)
		}
		res.Jobs = int(sysN)
		res.JobsPerSec = float64(sysN) / sysT.Seconds()
		res.withStats(Summarize(sysLat))
		bs := Summarize(baseLat)
		res.Extra["baseline_per_sec"] = float64(baseN) / baseT.Seconds()
		res.Extra["baseline_p50_ms"] = bs.P50
		res.Extra["baseline_p99_ms"] = bs.P99
		res.Extra["ratio_vs_baseline"] = res.JobsPerSec / res.Extra["baseline_per_sec"]
		if c, ok := rn.sys.(Counter); ok {
			got, err := c.Unfinished(ctx)
			if err != nil {
				return fmt.Errorf("%s: count jobs: %w", rn.sys.Name(), err)
			}
			// Every acknowledged enqueue must be in the table, once.
			if got > sysN {
				res.Duplicates = got - sysN
			} else {
				res.Missing = sysN - got
			}
		} else {
			res.Missing = -1
		}
		return ctx.Err()
	})
	return res, err
}

// closedLoop runs p goroutines calling f back to back for d and returns the
// number of successful calls, the time taken and each call's latency (ms).
func closedLoop(ctx context.Context, p int, d time.Duration, f func(context.Context) error) (int64, time.Duration, []float64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lats := make([][]float64, p)
	var n atomic.Int64
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range p {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t := time.Now()
				if err := f(ctx); err != nil {
					cancel(err)
					return
				}
				lats[w] = append(lats[w], ms(time.Since(t)))
				n.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []float64
	for _, l := range lats {
		all = append(all, l...)
	}
	if err := context.Cause(ctx); err != nil {
		return 0, 0, nil, err
	}
	return n.Load(), elapsed, all, nil
}

// baseline is a table with the columns of a job row and only a primary
// key: what PostgreSQL commits when nothing but the row is written.
type baseline struct {
	pool   *pgxpool.Pool
	schema string
	table  string
}

func newBaseline(ctx context.Context, pool *pgxpool.Pool) (*baseline, error) {
	b := &baseline{pool: pool, schema: "pgwake_bench_baseline_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	b.table = sqlident.Quote(b.schema, "baseline_jobs")
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+sqlident.Quote(b.schema)+`;
CREATE TABLE `+b.table+` (
	id           bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
	queue        text        NOT NULL,
	kind         text        NOT NULL,
	payload      jsonb       NOT NULL DEFAULT '{}',
	priority     smallint    NOT NULL DEFAULT 0,
	state        text        NOT NULL DEFAULT 'pending',
	attempts     integer     NOT NULL DEFAULT 0,
	max_attempts integer     NOT NULL DEFAULT 5,
	run_after    timestamptz NOT NULL DEFAULT now(),
	created_at   timestamptz NOT NULL DEFAULT now()
)`)
	if err != nil {
		return nil, fmt.Errorf("create baseline table: %w", err)
	}
	return b, nil
}

func (b *baseline) insert(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, `INSERT INTO `+b.table+` (queue, kind, payload) VALUES ($1, $2, $3)`,
		"bench", "bench", []byte(`{"seq":1}`))
	return err
}

func (b *baseline) drop(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, _ = b.pool.Exec(ctx, `DROP SCHEMA `+sqlident.Quote(b.schema)+` CASCADE`)
}

// queues times one EnqueueSpread of QueuesJobs jobs over as many queues,
// then the same rows (queue, kind, payload) in one plain INSERT into the
// baseline table: ratio is the plain INSERT's time over the system's (1 is
// as fast as the plain INSERT). Missing counts jobs the system lacks
// afterwards.
func (rn *runner) queues(ctx context.Context) ([]Result, error) {
	qs, ok := rn.sys.(QueueSpreader)
	if !ok {
		return nil, nil
	}
	n := rn.sizes.QueuesJobs
	res := Result{Mode: ModeQueues, System: rn.sys.Name(), Jobs: n, Extra: map[string]float64{"queues": float64(n)}}
	noLatency(&res)
	err := rn.fresh(ctx, func() error {
		rn.logf("%s: one enqueue of %d jobs over %d queues", rn.sys.Name(), n, n)
		start := time.Now()
		got, err := qs.EnqueueSpread(ctx, n)
		took := time.Since(start)
		if err != nil {
			return fmt.Errorf("%s: enqueue over %d queues: %w", rn.sys.Name(), n, err)
		}
		res.Missing = max(int64(n)-got, 0)
		res.JobsPerSec = float64(n) / max(took.Seconds(), 1e-9)
		res.Extra["enqueue_ms"] = ms(took)

		b, err := newBaseline(ctx, rn.env.Pool)
		if err != nil {
			return err
		}
		defer b.drop(ctx)
		start = time.Now()
		if _, err := rn.env.Pool.Exec(ctx, `INSERT INTO `+b.table+` (queue, kind, payload)
			SELECT 'q' || g, 'bench', jsonb_build_object('seq', g) FROM generate_series(1, $1::int) g`, n); err != nil {
			return fmt.Errorf("baseline insert: %w", err)
		}
		base := time.Since(start)
		res.Extra["baseline_ms"] = ms(base)
		res.Extra["ratio"] = ms(base) / max(ms(took), 1e-9)
		return nil
	})
	return []Result{res}, err
}

// scale drains the small backlog, the large one, and the small one with
// ScaleFinished finished jobs in the table.
func (rn *runner) scale(ctx context.Context) ([]Result, error) {
	s := rn.sizes
	cases := []struct{ pending, finished int }{{s.ScaleSmall, 0}, {s.ScaleLarge, 0}}
	if _, ok := rn.sys.(Finisher); ok && s.ScaleFinished > 0 {
		cases = append(cases, struct{ pending, finished int }{s.ScaleSmall, s.ScaleFinished})
	}
	var out []Result
	var small float64
	for i, c := range cases {
		r, err := rn.drain(ctx, c.pending, c.finished)
		r.Mode = ModeScale
		r.Case = fmt.Sprintf("pending=%d finished=%d", c.pending, c.finished)
		r.Extra["pending"] = float64(c.pending)
		r.Extra["finished"] = float64(c.finished)
		if i == 0 {
			small = r.JobsPerSec
		}
		r.Extra["ratio_vs_small"] = r.JobsPerSec / small
		out = append(out, r)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// scheduled runs the latency mode on an empty queue, then with
// ScheduledJobs jobs scheduled 1 hour to 7 days ahead in the same queue
// (they never become due during the run), then, for a FailedKeeper, with
// that backlog and ScheduledFailed failed jobs kept by retention. Each
// later result carries p99_ratio and p50_ratio against the first.
func (rn *runner) scheduled(ctx context.Context) ([]Result, error) {
	cases := []struct{ ahead, failed int }{{0, 0}, {rn.sizes.ScheduledJobs, 0}}
	if _, ok := rn.sys.(FailedKeeper); ok && rn.sizes.ScheduledFailed > 0 {
		cases = append(cases, struct{ ahead, failed int }{rn.sizes.ScheduledJobs, rn.sizes.ScheduledFailed})
	}
	var out []Result
	for i, c := range cases {
		var prepare func() error
		if c.ahead > 0 {
			prepare = func() error { return rn.scheduleBacklog(ctx, c.ahead, c.failed) }
		}
		r, err := rn.latency(ctx, ModeScheduled, rn.sizes.Rate, rn.sizes.LatencyDuration, prepare)
		r.Case = fmt.Sprintf("scheduled=%d", c.ahead)
		if c.failed > 0 {
			r.Case += fmt.Sprintf(",failed=%d", c.failed)
		}
		r.Extra["scheduled"] = float64(c.ahead)
		r.Extra["failed_kept"] = float64(c.failed)
		if i > 0 && len(out) > 0 {
			r.Extra["p99_ratio"] = r.P99 / out[0].P99
			r.Extra["p50_ratio"] = r.P50 / out[0].P50
		}
		out = append(out, r)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// scheduleBacklog fills the fresh tables for a scheduled case: ahead jobs
// scheduled 1 hour to 7 days ahead, then failed jobs kept by retention.
func (rn *runner) scheduleBacklog(ctx context.Context, ahead, failed int) error {
	rn.logf("%s: scheduling %d jobs ahead", rn.sys.Name(), ahead)
	now := time.Now()
	week := 7*24*time.Hour - time.Hour
	for from := 0; from < ahead; from += rn.sizes.BatchSize {
		to := min(from+rn.sizes.BatchSize, ahead)
		jobs := make([]Job, 0, to-from)
		for j := from; j < to; j++ {
			// Seqs past the latency run's: never recorded.
			at := now.Add(time.Hour + time.Duration(int64(week)/int64(ahead)*int64(j)))
			jobs = append(jobs, Job{Seq: 1<<40 + int64(j), RunAt: at})
		}
		if err := rn.sys.InsertMany(ctx, jobs); err != nil {
			return fmt.Errorf("%s: schedule jobs %d..%d: %w", rn.sys.Name(), from, to-1, err)
		}
	}
	if failed > 0 {
		rn.logf("%s: keeping %d failed jobs", rn.sys.Name(), failed)
		if err := rn.sys.(FailedKeeper).InsertFailed(ctx, failed); err != nil {
			return fmt.Errorf("%s: keep %d failed jobs: %w", rn.sys.Name(), failed, err)
		}
	}
	if st, ok := rn.sys.(Settler); ok {
		return st.Settle(ctx)
	}
	return nil
}

// housekeeping times the system's retention and event pruning with
// HousekeepingSmall and HousekeepingLarge rows kept, HousekeepingExpired
// expired in each. The second result carries the per-batch ratios against
// the first.
func (rn *runner) housekeeping(ctx context.Context) ([]Result, error) {
	hk, ok := rn.sys.(Housekeeper)
	if !ok {
		return nil, nil
	}
	var out []Result
	for i, kept := range []int{rn.sizes.HousekeepingSmall, rn.sizes.HousekeepingLarge} {
		expired := rn.sizes.HousekeepingExpired
		res := Result{Mode: ModeHousekeeping, System: rn.sys.Name(), Case: fmt.Sprintf("kept=%d", kept), Jobs: expired,
			Extra: map[string]float64{"kept": float64(kept)}}
		noLatency(&res)
		err := rn.fresh(ctx, func() error {
			rn.logf("%s: housekeeping with %d rows kept, %d expired", rn.sys.Name(), kept, expired)
			h, err := hk.Housekeep(ctx, kept, expired)
			if err != nil {
				return err
			}
			res.Extra["retention_batches"] = float64(h.RetentionBatches)
			res.Extra["retention_batch_ms"] = ms(h.Retention) / float64(max(h.RetentionBatches, 1))
			res.Extra["prune_batches"] = float64(h.PruneBatches)
			res.Extra["prune_batch_ms"] = ms(h.Prune) / float64(max(h.PruneBatches, 1))
			res.Missing = max(int64(expired)-h.JobsDeleted, 0) + max(int64(expired)-h.EventsDeleted, 0)
			res.JobsPerSec = float64(h.JobsDeleted) / max(h.Retention.Seconds(), 1e-9)
			return nil
		})
		if i > 0 && len(out) > 0 {
			res.Extra["retention_ratio"] = res.Extra["retention_batch_ms"] / out[0].Extra["retention_batch_ms"]
			res.Extra["prune_ratio"] = res.Extra["prune_batch_ms"] / out[0].Extra["prune_batch_ms"]
		}
		out = append(out, res)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// concurrent runs ConcurrentJobs jobs whose handlers each sleep
// ConcurrentSleep (waiting on something else: a partner API, a render), all
// allowed to run at once, on a pool of ConcurrentPool connections of the
// mode's own. The ideal is every job at once: ConcurrentJobs /
// ConcurrentSleep jobs/s; "of_ideal" is the fraction reached, from the
// workers' start until no job is unfinished.
func (rn *runner) concurrent(ctx context.Context) (Result, error) {
	n, sleep := rn.sizes.ConcurrentJobs, rn.sizes.ConcurrentSleep
	res := Result{Mode: ModeConcurrent, System: rn.sys.Name(), Jobs: n, Extra: map[string]float64{}}
	noLatency(&res)
	pcfg := rn.env.Pool.Config().Copy()
	pcfg.MaxConns = int32(rn.sizes.ConcurrentPool)
	pcfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, fmt.Errorf("concurrent: pool: %w", err)
	}
	defer pool.Close()
	shared := rn.env
	rn.env = &Env{Pool: pool, Workers: n, Logf: shared.Logf, LeaseDuration: rn.sizes.ConcurrentLease}
	defer func() { rn.env = shared }()
	err = rn.fresh(ctx, func() error {
		rn.logf("%s: inserting %d jobs that sleep %s", rn.sys.Name(), n, sleep)
		if err := rn.insertSleeping(ctx, n, nil, sleep); err != nil {
			return err
		}
		checkpoint(ctx, pool)
		rn.logf("%s: running %d jobs of %s on %d connections", rn.sys.Name(), n, sleep, rn.sizes.ConcurrentPool)
		base := time.Now()
		rec := newRecorder(n, base)
		stop, err := rn.sys.Start(ctx, rec.handle)
		if err != nil {
			return fmt.Errorf("%s: start workers: %w", rn.sys.Name(), err)
		}
		elapsed, err := rn.untilFinished(ctx, rec, base, rn.sizes.IdleTimeout+sleep, sleep, &res)
		if err != nil {
			_ = stop()
			return err
		}
		serr := stop()
		rn.diagnose(&res)
		res.Duplicates, res.Missing = rec.tally()
		res.JobsPerSec = float64(n-int(res.Missing)) / elapsed.Seconds()
		res.Extra["seconds"] = elapsed.Seconds()
		res.Extra["ideal_jobs_per_sec"] = float64(n) / sleep.Seconds()
		res.Extra["of_ideal"] = res.JobsPerSec / res.Extra["ideal_jobs_per_sec"]
		if serr != nil {
			return fmt.Errorf("%s: stop workers: %w", rn.sys.Name(), serr)
		}
		return ctx.Err()
	})
	return res, err
}

// untilFinished waits until every job has started and, where the system can
// count, none is unfinished, giving up grace after the last start; it
// returns the time since base. Jobs left unfinished go to res's extras.
// run is how long every handler runs at least (the concurrent mode's
// sleep): no count can be zero before the last start plus run, so the
// counts begin then. Counting from the last start on (every ~3 ms, a
// query of about 1 ms) loaded the 2-core machine's database while the
// system wrote the completions the mode measures.
func (rn *runner) untilFinished(ctx context.Context, rec *recorder, base time.Time, grace, run time.Duration, res *Result) (time.Duration, error) {
	all := rec.wait(grace, ctx.Done())
	elapsed := time.Since(base)
	c, ok := rn.sys.(Counter)
	if !ok || !all {
		return elapsed, nil
	}
	_, last := rec.startSpan() // every job has started: it stays put
	if d := last + run - time.Since(base); d > 0 && !sleepCtx(ctx, d) {
		return time.Since(base), ctx.Err()
	}
	for {
		left, err := c.Unfinished(ctx)
		elapsed = time.Since(base)
		if err != nil {
			return elapsed, fmt.Errorf("%s: count unfinished: %w", rn.sys.Name(), err)
		}
		if left == 0 {
			return elapsed, nil
		}
		if elapsed > last+grace {
			res.Extra["unfinished"] = float64(left)
			return elapsed, nil
		}
		time.Sleep(2 * time.Millisecond)
	}
}
