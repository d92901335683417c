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

func run(ctx context.Context, env *bench.Env, sizes bench.Sizes, natsURL string) (res bench.Result, err error) {
	n := sizes.StreamJobs
	res = bench.Result{Mode: bench.ModeStream, System: "pgwake", Jobs: n, Extra: map[string]float64{}}
	pool := env.Pool
	sys := &bench.Pgwake{}
	if err := sys.Setup(ctx, env); err != nil {
		return res, fmt.Errorf("setup: %w", err)
	}
	schema := sys.Schema()
	cleanup := []func(context.Context){func(ctx context.Context) { _ = sys.Teardown(ctx) }}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i](cctx)
		}
	}()

	nc, err := nats.Connect(natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		return res, fmt.Errorf("%w: %s: %v", natsbridge.ErrUnreachable, natsURL, err)
	}
	cleanup = append(cleanup, func(context.Context) { nc.Close() })
	js, err := nc.JetStream()
	if err != nil {
		return res, err
	}
	name := "pgwake_bench_" + randomName()
	newTarget := func(suffix string) (*target, events.Config, error) {
		t := &target{stream: strings.ToUpper(name + "_" + suffix), subject: name + "." + suffix}
		pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: natsURL, Stream: t.stream, Subjects: []string{t.subject}})
		if err != nil {
			return nil, events.Config{}, err
		}
		t.pub = pub
		cleanup = append(cleanup, func(context.Context) { _ = pub.Close(); _ = js.DeleteStream(t.stream) })
		slot := name + "_" + suffix
		cleanup = append(cleanup, func(ctx context.Context) { _ = events.DropSlot(ctx, pool, slot, true) })
		return t, events.Config{Schema: schema, Slot: slot, Publication: name, Publisher: pub, Topic: events.SingleTopic(t.subject)}, nil
	}
	if err := events.EnsurePublication(ctx, pool, schema, name); err != nil {
		return res, err
	}
	cleanup = append(cleanup, func(ctx context.Context) { _ = events.DropPublication(ctx, pool, name) })
	live, liveCfg, err := newTarget("live")
	if err != nil {
		return res, err
	}
	capTarget, capCfg, err := newTarget("capacity")
	if err != nil {
		return res, err
	}
	// The capacity slot starts here, before any event of the run.
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, capCfg.Slot); err != nil {
		return res, fmt.Errorf("creating slot %s: %w", capCfg.Slot, err)
	}

	stream, err := events.New(pool, liveCfg)
	if err != nil {
		return res, err
	}
	sctx, stopStream := context.WithCancel(ctx)
	streamDone := make(chan error, 1)
	go func() { streamDone <- stream.Run(sctx) }()
	defer func() {
		stopStream()
		if serr := <-streamDone; serr != nil && err == nil {
			err = fmt.Errorf("live stream: %w", serr)
		}
	}()
	for stream.Sessions() == 0 {
		select {
		case err := <-streamDone:
			streamDone <- err
			return res, fmt.Errorf("live stream ended: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}

	env.Logf("stream: inserting %d jobs", n)
	for from := 0; from < n; from += sizes.BatchSize {
		jobs := make([]bench.Job, 0, sizes.BatchSize)
		for i := from; i < min(from+sizes.BatchSize, n); i++ {
			jobs = append(jobs, bench.Job{Seq: int64(i)})
		}
		if err := sys.InsertMany(ctx, jobs); err != nil {
			return res, err
		}
	}
	// The live stream catches up with the inserts before the drain.
	if err := waitAcked(ctx, pool, stream, 5*time.Minute); err != nil {
		return res, err
	}
	firstDrainID, err := sys.Client().LastEventID(ctx)
	if err != nil {
		return res, err
	}

	env.Logf("stream: draining %d jobs while forwarding", n)
	lagCtx, stopLag := context.WithCancel(ctx)
	var maxLag atomic.Int64
	var lagWG sync.WaitGroup
	lagWG.Go(func() { sampleLag(lagCtx, pool, liveCfg.Slot, &maxLag) })
	base := time.Now()
	stopWorkers, err := sys.Start(ctx, func(int64) {})
	if err != nil {
		stopLag()
		return res, err
	}
	for {
		left, err := sys.Unfinished(ctx)
		if err != nil {
			stopLag()
			_ = stopWorkers()
			return res, err
		}
		if left == 0 {
			break
		}
		if ctx.Err() != nil {
			stopLag()
			_ = stopWorkers()
			return res, ctx.Err()
		}
		time.Sleep(5 * time.Millisecond)
	}
	drained := time.Since(base)
	if err := stopWorkers(); err != nil {
		stopLag()
		return res, err
	}
	caughtUp := time.Now()
	err = waitAcked(ctx, pool, stream, 5*time.Minute)
	caughtUpAfter := time.Since(caughtUp)
	stopLag()
	lagWG.Wait()
	if err != nil {
		return res, err
	}

	drainEvents, err := sys.Client().EventCount(ctx, firstDrainID)
	if err != nil {
		return res, err
	}
	allEvents, err := sys.Client().EventCount(ctx, 0)
	if err != nil {
		return res, err
	}
	res.JobsPerSec = float64(n) / drained.Seconds()
	res.Extra["queue_events_per_sec"] = float64(drainEvents) / drained.Seconds()
	res.Extra["events"] = float64(allEvents)
	res.Extra["max_slot_lag_mib"] = float64(maxLag.Load()) / (1 << 20)
	res.Extra["caught_up_ms"] = float64(caughtUpAfter) / float64(time.Millisecond)

	env.Logf("stream: reading %d drain events back from JetStream", drainEvents)
	lat, seen, err := latencies(js, live.subject, firstDrainID, int(drainEvents))
	if err != nil {
		return res, err
	}
	st := bench.Summarize(lat)
	res.P50, res.P90, res.P99, res.Max = st.P50, st.P90, st.P99, st.Max
	res.Missing = drainEvents - int64(seen)

	env.Logf("stream: forwarding the backlog of %d events from a second slot", allEvents)
	capStream, err := events.New(pool, capCfg)
	if err != nil {
		return res, err
	}
	cctx, stopCap := context.WithCancel(ctx)
	capDone := make(chan error, 1)
	t0 := time.Now()
	go func() { capDone <- capStream.Run(cctx) }()
	err = waitAcked(ctx, pool, capStream, 5*time.Minute)
	forward := time.Since(t0)
	stopCap()
	if cerr := <-capDone; cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return res, fmt.Errorf("capacity stream: %w", err)
	}
	info, err := js.StreamInfo(capTarget.stream)
	if err != nil {
		return res, err
	}
	if int64(info.State.Msgs) != allEvents {
		return res, fmt.Errorf("capacity stream stored %d messages, the table has %d events", info.State.Msgs, allEvents)
	}
	res.Extra["forward_events_per_sec"] = float64(allEvents) / forward.Seconds()
	res.Extra["capacity_ratio"] = res.Extra["forward_events_per_sec"] / res.Extra["queue_events_per_sec"]
	return res, nil
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
