package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/promreg"
)

// interruptions runs the queue and a producer while interrupt breaks the
// stream's connection rounds times, then checks that every event arrived.
func interruptions(t *testing.T, e *env, rounds int, interrupt func(round int)) {
	ctx := context.Background()
	ps, col := channelSink(t)
	reg := prometheus.NewRegistry()
	cfg := e.Config(ps)
	cfg.Registerer = reg
	s, stopStream := e.RunStream(cfg)
	c := e.QueueClient(4)
	stopQueue := e.RunQueue(c)
	stopProducer := e.Produce(c)

	for round := 0; round < rounds; round++ {
		// Let some events flow in this session first.
		before := len(col.Snapshot())
		waitFor(t, 60*time.Second, "events flowing", func() bool { return len(col.Snapshot()) > before+50 })
		sessions := s.Sessions()
		interrupt(round)
		waitFor(t, 60*time.Second, "stream reconnected", func() bool { return s.Sessions() > sessions })
	}
	batches := stopProducer()
	require.Positive(t, batches)
	waitFor(t, 90*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 0 })
	stopQueue()
	table := e.WaitDelivered(col, 60*time.Second)
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
	got := col.Snapshot()
	checkDelivery(t, got, table)
	t.Logf("%d events in the table, %d deliveries over %d sessions", len(table), len(got), s.Sessions())
	// Metrics: every delivery counted, every interruption a reconnect.
	require.Equal(t, float64(len(got)), metricSum(t, reg, "pgwake_events_published_total"))
	require.GreaterOrEqual(t, metricSum(t, reg, "pgwake_events_reconnects_total"), float64(rounds))
	mismatches, err := events.Verify(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
	require.Empty(t, mismatches)
}

func TestStreamSurvivesTerminatedWalsender(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	interruptions(t, e, 3, func(int) {
		var n int
		require.NoError(t, e.Pool.QueryRow(context.Background(),
			`SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, e.Slot).Scan(&n))
		require.Equal(t, 1, n, "the walsender was running")
	})
}

// Not parallel: restarting the test binary's cluster breaks every
// connection. Parallel tests run only after the sequential ones.
func TestStreamSurvivesPostgresRestart(t *testing.T) {
	cluster := pgtest.RestartableCluster(t)
	e := newEnv(t)
	if cluster != pgtest.Cluster() {
		// A private cluster: the stream and its checks run there.
		e = newEnvOn(t, pgtest.PoolOn(t, cluster.URL, nil))
	}
	modes := []string{"fast", "immediate"}
	interruptions(t, e, len(modes), func(round int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		require.NoError(t, cluster.Restart(ctx, modes[round]))
		e.Pool.Reset() // drop the dead connections at once
	})
}

// metricSum sums the samples of a metric family.
func metricSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	v, err := promreg.Sum(reg, name)
	require.NoError(t, err)
	return v
}
