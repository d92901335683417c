// Package streambench is `pgwake bench`'s stream mode: the queue drains
// jobs at full speed while the event stream forwards its events to NATS
// JetStream. It lives apart from internal/bench so that the peers program,
// which shares internal/bench, does not depend on the events packages.
package streambench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/natsbridge"
	"github.com/pgwake/pgwake/internal/bench"
)

// Mode returns the stream mode for bench.Options.Stream, publishing to the
// NATS server at natsURL.
//
// One run: a fresh pgwake schema, a slot for the live stream and a second
// slot created at the same time for the capacity measurement. The live
// stream runs while N jobs are inserted and then drained; the figures are
//   - p50..max: commit-to-broker latency of the drain's events, from the
//     event's `at` (written in its transaction, just before the commit) to
//     the time JetStream stored it (the message's stream timestamp);
//   - jobs_per_sec and queue_events_per_sec: the drain's rate;
//   - max_slot_lag_mib: the live slot's largest retained WAL, sampled every
//     100 ms; caught_up_ms: from the last job's completion to the live
//     slot acknowledging the end of the WAL;
//   - forward_events_per_sec: afterwards, the second slot's backlog (every
//     event of the run) forwarded to another JetStream stream, timed from
//     the stream's start to its acknowledgement of the end of the WAL;
//     capacity_ratio is that over queue_events_per_sec.
//
// Missing counts drain events not found in the live JetStream stream.
func Mode(natsURL string) func(ctx context.Context, env *bench.Env, sizes bench.Sizes) (bench.Result, error) {
	return func(ctx context.Context, env *bench.Env, sizes bench.Sizes) (bench.Result, error) {
		return run(ctx, env, sizes, natsURL)
	}
}

func randomName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// target is a JetStream stream and a subject prefix it captures.
type target struct {
	stream, subject string
	pub             interface{ Close() error }
}

// streamRun is one run of the stream mode: its system, targets and the
// cleanups of what it created, run in reverse order at the end.
type streamRun struct {
	env     *bench.Env
	sizes   bench.Sizes
	natsURL string
	pool    *pgxpool.Pool
	sys     *bench.Pgwake
	cleanup []func(context.Context)

	js                  nats.JetStreamContext
	name                string
	live, capacity      *target
	liveCfg, capCfg     events.Config
	stream              *events.Stream // the live stream
	firstDrainID        int64          // the last event before the drain
	drainEvents, events int64
}

func run(ctx context.Context, env *bench.Env, sizes bench.Sizes, natsURL string) (res bench.Result, err error) {
	n := sizes.StreamJobs
	res = bench.Result{Mode: bench.ModeStream, System: "pgwake", Jobs: n, Extra: map[string]float64{}}
	r := &streamRun{env: env, sizes: sizes, natsURL: natsURL, pool: env.Pool, sys: &bench.Pgwake{}}
	defer r.close(ctx)
	if err := r.setup(ctx); err != nil {
		return res, err
	}
	stopStream, err := r.startLive(ctx)
	if err != nil {
		return res, err
	}
	defer func() {
		if serr := stopStream(); serr != nil && err == nil {
			err = fmt.Errorf("live stream: %w", serr)
		}
	}()
	if err := r.insert(ctx); err != nil {
		return res, err
	}
	if err := r.drain(ctx, &res); err != nil {
		return res, err
	}
	env.Logf("stream: reading %d drain events back from JetStream", r.drainEvents)
	lat, seen, err := latencies(r.js, r.live.subject, r.firstDrainID, int(r.drainEvents))
	if err != nil {
		return res, err
	}
	st := bench.Summarize(lat)
	res.P50, res.P90, res.P99, res.Max = st.P50, st.P90, st.P99, st.Max
	res.Missing = r.drainEvents - int64(seen)
	return res, r.forwardBacklog(ctx, &res)
}

// close runs the cleanups, last first.
func (r *streamRun) close(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	for i := len(r.cleanup) - 1; i >= 0; i-- {
		r.cleanup[i](cctx)
	}
}

// setup creates the schema, the publication, a JetStream stream and a slot
// for the live stream and for the capacity measurement; the capacity slot
// starts here, before any event of the run.
func (r *streamRun) setup(ctx context.Context) error {
	if err := r.sys.Setup(ctx, r.env); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	r.cleanup = append(r.cleanup, func(ctx context.Context) { _ = r.sys.Teardown(ctx) })
	nc, err := nats.Connect(r.natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("%w: %s: %v", natsbridge.ErrUnreachable, r.natsURL, err)
	}
	r.cleanup = append(r.cleanup, func(context.Context) { nc.Close() })
	if r.js, err = nc.JetStream(); err != nil {
		return err
	}
	r.name = "pgwake_bench_" + randomName()
	if err := events.EnsurePublication(ctx, r.pool, r.sys.Schema(), r.name); err != nil {
		return err
	}
	r.cleanup = append(r.cleanup, func(ctx context.Context) { _ = events.DropPublication(ctx, r.pool, r.name) })
	if r.live, r.liveCfg, err = r.newTarget("live"); err != nil {
		return err
	}
	if r.capacity, r.capCfg, err = r.newTarget("capacity"); err != nil {
		return err
	}
	if _, err := r.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, r.capCfg.Slot); err != nil {
		return fmt.Errorf("creating slot %s: %w", r.capCfg.Slot, err)
	}
	return nil
}

// newTarget creates a JetStream stream and the stream config of a slot
// that forwards to it.
func (r *streamRun) newTarget(suffix string) (*target, events.Config, error) {
	t := &target{stream: strings.ToUpper(r.name + "_" + suffix), subject: r.name + "." + suffix}
	pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: r.natsURL, Stream: t.stream, Subjects: []string{t.subject}})
	if err != nil {
		return nil, events.Config{}, err
	}
	t.pub = pub
	r.cleanup = append(r.cleanup, func(context.Context) { _ = pub.Close(); _ = r.js.DeleteStream(t.stream) })
	slot := r.name + "_" + suffix
	r.cleanup = append(r.cleanup, func(ctx context.Context) { _ = events.DropSlot(ctx, r.pool, slot, true) })
	return t, events.Config{Schema: r.sys.Schema(), Slot: slot, Publication: r.name, Publisher: pub, Topic: events.SingleTopic(t.subject)}, nil
}

// startLive runs the live stream until stop, and waits for its first
// session.
func (r *streamRun) startLive(ctx context.Context) (stop func() error, err error) {
	if r.stream, err = events.New(r.pool, r.liveCfg); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.stream.Run(sctx) }()
	stop = func() error { cancel(); return <-done }
	for r.stream.Sessions() == 0 {
		select {
		case err := <-done:
			done <- err
			return stop, fmt.Errorf("live stream ended: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return stop, nil
}

// insert enqueues the jobs in batches and waits for the live stream to
// catch up with them.
func (r *streamRun) insert(ctx context.Context) error {
	n, batch := r.sizes.StreamJobs, r.sizes.BatchSize
	r.env.Logf("stream: inserting %d jobs", n)
	for from := 0; from < n; from += batch {
		jobs := make([]bench.Job, 0, batch)
		for i := from; i < min(from+batch, n); i++ {
			jobs = append(jobs, bench.Job{Seq: int64(i)})
		}
		if err := r.sys.InsertMany(ctx, jobs); err != nil {
			return err
		}
	}
	if err := waitAcked(ctx, r.pool, r.stream, 5*time.Minute); err != nil {
		return err
	}
	var err error
	r.firstDrainID, err = r.sys.Client().LastEventID(ctx)
	return err
}

// drain works every job while the live stream forwards, sampling the
// slot's lag, then waits for the stream to catch up; it sets the rates,
// the lag and the event counts.
func (r *streamRun) drain(ctx context.Context, res *bench.Result) error {
	n := r.sizes.StreamJobs
	r.env.Logf("stream: draining %d jobs while forwarding", n)
	lagCtx, stopLag := context.WithCancel(ctx)
	var maxLag atomic.Int64
	var lagWG sync.WaitGroup
	lagWG.Go(func() { sampleLag(lagCtx, r.pool, r.liveCfg.Slot, &maxLag) })
	defer lagWG.Wait()
	defer stopLag()
	base := time.Now()
	started := newStartCounter(n)
	stopWorkers, err := r.sys.Start(ctx, started.handle)
	if err != nil {
		return err
	}
	if err := r.waitDrained(ctx, started); err != nil {
		_ = stopWorkers()
		return err
	}
	drained := time.Since(base)
	if err := stopWorkers(); err != nil {
		return err
	}
	caughtUp := time.Now()
	err = waitAcked(ctx, r.pool, r.stream, 5*time.Minute)
	caughtUpAfter := time.Since(caughtUp)
	stopLag()
	lagWG.Wait()
	if err != nil {
		return err
	}
	if r.drainEvents, err = r.sys.Client().EventCount(ctx, r.firstDrainID); err != nil {
		return err
	}
	if r.events, err = r.sys.Client().EventCount(ctx, 0); err != nil {
		return err
	}
	res.JobsPerSec = float64(n) / drained.Seconds()
	res.Extra["queue_events_per_sec"] = float64(r.drainEvents) / drained.Seconds()
	res.Extra["events"] = float64(r.events)
	res.Extra["max_slot_lag_mib"] = float64(maxLag.Load()) / (1 << 20)
	res.Extra["caught_up_ms"] = float64(caughtUpAfter) / float64(time.Millisecond)
	return nil
}

// startCounter counts handler calls and closes all at the n-th.
type startCounter struct {
	n, calls atomic.Int64
	all      chan struct{}
}

func newStartCounter(n int) *startCounter {
	c := &startCounter{all: make(chan struct{})}
	c.n.Store(int64(n))
	return c
}

func (c *startCounter) handle(int64) {
	if c.calls.Add(1) == c.n.Load() {
		close(c.all)
	}
}

// waitDrained waits until every job has started, then polls until no job
// is unfinished. The count is an exact read of the whole table (about
// 150 ms on a loaded machine): polled from the start, back to back, it
// kept one backend busy for the whole drain, taking CPU from the queue and
// the walsender that the measurement is about (as the drain mode, it now
// starts counting after the last start).
func (r *streamRun) waitDrained(ctx context.Context, started *startCounter) error {
	// Every 5 s meanwhile, so that a start the counter missed cannot hang
	// the run.
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
wait:
	for {
		select {
		case <-started.all:
			break wait
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if left, err := r.sys.Unfinished(ctx); err != nil || left == 0 {
				return err
			}
		}
	}
	for {
		left, err := r.sys.Unfinished(ctx)
		if err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// forwardBacklog forwards every event of the run from the capacity slot
// and times it.
func (r *streamRun) forwardBacklog(ctx context.Context, res *bench.Result) error {
	r.env.Logf("stream: forwarding the backlog of %d events from a second slot", r.events)
	capStream, err := events.New(r.pool, r.capCfg)
	if err != nil {
		return err
	}
	cctx, stopCap := context.WithCancel(ctx)
	capDone := make(chan error, 1)
	t0 := time.Now()
	go func() { capDone <- capStream.Run(cctx) }()
	err = waitAcked(ctx, r.pool, capStream, 5*time.Minute)
	forward := time.Since(t0)
	stopCap()
	if cerr := <-capDone; cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("capacity stream: %w", err)
	}
	info, err := r.js.StreamInfo(r.capacity.stream)
	if err != nil {
		return err
	}
	if int64(info.State.Msgs) != r.events {
		return fmt.Errorf("capacity stream stored %d messages, the table has %d events", info.State.Msgs, r.events)
	}
	res.Extra["forward_events_per_sec"] = float64(r.events) / forward.Seconds()
	res.Extra["capacity_ratio"] = res.Extra["forward_events_per_sec"] / res.Extra["queue_events_per_sec"]
	return nil
}

// waitAcked waits until s acknowledged the WAL position current at the
// call.
func waitAcked(ctx context.Context, pool *pgxpool.Pool, s *events.Stream, limit time.Duration) error {
	var lsnText string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsnText); err != nil {
		return err
	}
	target, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(limit)
	for s.Acked() < target {
		if time.Now().After(deadline) {
			return fmt.Errorf("the stream did not acknowledge %s within %s (at %s)", target, limit, s.Acked())
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// sampleLag keeps the largest WAL the slot retains, every 100 ms.
func sampleLag(ctx context.Context, pool *pgxpool.Pool, slot string, maxLag *atomic.Int64) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		var lag int64
		err := pool.QueryRow(ctx, `SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
			FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lag)
		if err == nil && lag > maxLag.Load() {
			maxLag.Store(lag)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// latencies reads subject from the start of its stream and returns the
// commit-to-broker latency (ms) of every distinct event with an id above
// after, and how many there were: want, or fewer when no message came for
// two seconds.
func latencies(js nats.JetStreamContext, subject string, after int64, want int) ([]float64, int, error) {
	sub, err := js.SubscribeSync(subject, nats.OrderedConsumer(), nats.DeliverAll())
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	seen := map[int64]bool{}
	var lat []float64
	for len(seen) < want {
		msg, err := sub.NextMsg(2 * time.Second)
		if errors.Is(err, nats.ErrTimeout) {
			return lat, len(seen), nil
		}
		if err != nil {
			return nil, 0, err
		}
		ev, err := events.Decode(msg.Data)
		if err != nil {
			return nil, 0, err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return nil, 0, err
		}
		if ev.ID <= after || seen[ev.ID] {
			continue
		}
		seen[ev.ID] = true
		lat = append(lat, float64(meta.Timestamp.Sub(ev.At))/float64(time.Millisecond))
	}
	return lat, len(seen), nil
}
