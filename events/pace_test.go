package events_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/queue"
)

// timedPublisher remembers when the last Publish call returned, the commit
// LSN of its last message, and how many calls returned.
type timedPublisher struct {
	message.Publisher
	mu    sync.Mutex
	at    time.Time
	last  pglogrepl.LSN
	calls int
}

func (p *timedPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	lsn, _ := events.MessageLSN(msgs[len(msgs)-1])
	p.mu.Lock()
	p.at, p.last = time.Now(), lsn
	p.calls++
	p.mu.Unlock()
	return err
}

func (p *timedPublisher) lastPublish() (time.Time, pglogrepl.LSN, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.at, p.last, p.calls
}

func confirmedFlush(t *testing.T, e *env) pglogrepl.LSN {
	t.Helper()
	var s string
	require.NoError(t, e.Pool.QueryRow(context.Background(),
		`SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&s))
	lsn, err := pglogrepl.ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

// On an idle database the slot's confirmed position passes an event's
// commit promptly after its publication (ackDelay + inflightPoll, about
// 70 ms), although the status interval is 30 s and the server sends
// nothing meanwhile (it asks for a reply only after wal_sender_timeout/2,
// 30 s). The bound, 5 s, is far above the prompt path, so that a machine
// busy with parallel race-enabled tests does not fail it (354 ms in a full
// race run on 2 busy cores, against the former 200 ms), and far below the
// 25 s or more an acknowledgement waiting for the status interval would
// take. A restarted stream logs the slot's confirmed position, not its own
// empty one.
func TestIdleAcknowledgementIsPrompt(t *testing.T) { // not parallel: it times
	e := newEnv(t)
	ctx := context.Background()
	ps, col := channelSink(t)
	pub := &timedPublisher{Publisher: ps}
	cfg := e.Config(pub)
	cfg.StatusInterval = 30 * time.Second
	_, stopStream := e.RunStream(cfg)
	c := e.QueueClient(1)
	for round := 0; round < 3; round++ {
		_, _, before := pub.lastPublish()
		_, err := c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
		require.NoError(t, err)
		// The sink holds the event before the Publish call returns: wait
		// for the call (a look in between read no publish at all, and
		// timed the confirmation from the zero time).
		waitFor(t, 30*time.Second, "event published", func() bool {
			_, _, calls := pub.lastPublish()
			return calls > before
		})
		at, lsn, _ := pub.lastPublish()
		var confirmedAt time.Time
		waitFor(t, 10*time.Second, "confirmed_flush_lsn past the commit", func() bool {
			if confirmedFlush(t, e) > lsn {
				confirmedAt = time.Now()
				return true
			}
			return false
		})
		took := confirmedAt.Sub(at)
		t.Logf("round %d: confirmed %s after the publish", round, took)
		require.Less(t, took, 5*time.Second, "acknowledged without waiting for the status interval")
	}
	stopStream()
	// The last status update may still be in the old walsender's socket
	// when stopStream returns: read the slot once that walsender is gone.
	waitFor(t, 10*time.Second, "the slot released", func() bool {
		var active bool
		require.NoError(t, e.Pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&active))
		return !active
	})
	confirmed := confirmedFlush(t, e)

	core, logs := observer.New(zap.InfoLevel)
	cfg.Logger = zap.New(core)
	_, stopStream = e.RunStream(cfg)
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
	started := logs.FilterMessage("streaming events").All()
	require.NotEmpty(t, started)
	require.Equal(t, confirmed.String(), started[0].ContextMap()["confirmed_flush_lsn"])
}

// After catch-up the lag gauges read 0 s and no more WAL than was written
// after the last event, without waiting for a refresh.
func TestLagGaugesAreCurrentWhenScraped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ps, col := channelSink(t)
	reg := prometheus.NewRegistry()
	cfg := e.Config(ps)
	cfg.Registerer = reg
	cfg.LagInterval = time.Hour // the gauges must not depend on it
	s, stopStream := e.RunStream(cfg)
	c := e.QueueClient(1)
	_, err := c.EnqueueMany(ctx, make100("ok"))
	require.NoError(t, err)
	e.WaitDelivered(col, 60*time.Second)
	got := col.Snapshot()
	last := got[len(got)-1].LSN
	waitFor(t, 30*time.Second, "ack past the last event", func() bool { return uint64(s.Acked()) > last })
	// The gauge reads the slot on the server, which hears of the ack with
	// the next status update (within 100 ms): wait for that, not only for
	// the stream's own position.
	waitFor(t, 30*time.Second, "the slot's confirmed position past the last event", func() bool {
		return uint64(confirmedFlush(t, e)) > last
	})

	require.Zero(t, metricSum(t, reg, "pgwake_events_slot_lag_seconds"))
	lagBytes := metricSum(t, reg, "pgwake_events_slot_lag_bytes")
	var since float64
	require.NoError(t, e.Pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)`, pglogrepl.LSN(last).String()).Scan(&since))
	t.Logf("lag %v bytes, WAL since the last commit %v bytes", lagBytes, since)
	require.LessOrEqual(t, lagBytes, since)
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
}

// A session that fails right after connecting does not reset the backoff:
// with the walsender terminated as soon as it streams, the waits double.
func TestBackoffGrowsAcrossImmediateFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps, col := channelSink(t)
	core, logs := observer.New(zap.WarnLevel)
	cfg := e.Config(ps)
	cfg.Logger = zap.New(core)
	cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 5*time.Second
	_, stopStream := e.RunStream(cfg)

	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			_, _ = e.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, e.Slot)
			time.Sleep(5 * time.Millisecond)
		}
	})
	const rounds = 5
	var waits []time.Duration
	waitFor(t, 60*time.Second, "reconnects", func() bool {
		waits = waits[:0]
		for _, l := range logs.FilterMessage("replication stream interrupted; reconnecting").All() {
			waits = append(waits, l.ContextMap()["backoff"].(time.Duration))
		}
		return len(waits) >= rounds
	})
	cancel()
	wg.Wait()
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
	t.Logf("waits %v", waits)
	// Backoff b doubles from 50 ms; the wait is drawn from [b/2, b].
	for i := 0; i < rounds; i++ {
		require.GreaterOrEqual(t, waits[i], (cfg.MinBackoff<<i)/2, "wait %d of %v", i, waits)
	}
}

// A slot whose history predates its publication (the database was
// replaced, the publication dropped) fails on every reconnect: Run returns
// a permanent, typed error at once instead of retrying.
func TestMissingPublicationIsPermanent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ps, col := channelSink(t)
	cfg := e.Config(ps)
	_, stopStream := e.RunStream(cfg)
	stopStream()
	require.NoError(t, events.DropPublication(ctx, e.Pool, e.Pub))
	c := e.QueueClient(1)
	_, err := c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)

	s, err := events.New(e.Pool, cfg)
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	err = s.Run(rctx)
	t.Logf("Run returned after %s: %v", time.Since(start), err)
	require.Error(t, err)
	require.True(t, errors.Is(err, events.ErrPublication), "%v", err)
	var perm events.PermanentError
	require.ErrorAs(t, err, &perm)
	require.Contains(t, err.Error(), "drop-slot")
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, ps.Close())
	<-col.Done
}
