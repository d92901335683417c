package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/events/natsbridge"
	"github.com/pgwake/pgwake/internal/natstest"
	"github.com/pgwake/pgwake/queue"
)

// benchStream measures the stream's catch-up speed: b.N events committed
// one per transaction (like a job's succeeded event) while no consumer ran,
// then the stream started and timed until it acknowledged the last one.
func benchStream(b *testing.B, pub message.Publisher) {
	e := eventstest.NewEnv(b)
	ctx := context.Background()
	_, err := e.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, e.Slot)
	require.NoError(b, err)
	require.NoError(b, events.EnsurePublication(ctx, e.Pool, e.Schema, e.Pub))
	// One transaction per event, committed server-side.
	_, err = e.Pool.Exec(ctx, `CREATE PROCEDURE `+e.Table("bench_fill")+`(n int) LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..n LOOP
		INSERT INTO `+e.Table("events")+` (job_id, type, queue, kind, attempt) VALUES (i, 'succeeded', 'default', 'bench', 1);
		COMMIT;
	END LOOP;
END $$`)
	require.NoError(b, err)
	_, err = e.Pool.Exec(ctx, `CALL `+e.Table("bench_fill")+`($1)`, b.N)
	require.NoError(b, err)
	var target string
	require.NoError(b, e.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target))
	end, err := pglogrepl.ParseLSN(target)
	require.NoError(b, err)

	cfg := e.Config(pub)
	cfg.StatusInterval = time.Second
	s, err := events.New(e.Pool, cfg)
	require.NoError(b, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { done <- s.Run(runCtx) }()
	eventstest.WaitFor(b, 10*time.Minute, "stream caught up", func() bool { return s.Acked() >= end })
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	require.NoError(b, <-done)
	var lag int64
	require.NoError(b, e.Pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&lag))
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(lag), "lag-bytes")
}

// ackingGoChannel is a Go channel Pub/Sub whose "pgwake.events" messages
// are consumed and acknowledged as they come.
func ackingGoChannel(b *testing.B) *gochannel.GoChannel {
	ps := events.NewGoChannel(nil)
	sub, err := ps.Subscribe(context.Background(), "pgwake.events")
	require.NoError(b, err)
	go func() {
		for m := range sub {
			m.Ack()
		}
	}()
	return ps
}

// withNATS runs bench with a NATS JetStream publisher (stream on subject,
// at $PGWAKE_TEST_NATS_URL or the local server) and purges the stream after.
func withNATS(b *testing.B, stream, subject string, bench func(*testing.B, message.Publisher)) {
	url := natstest.URL()
	natstest.KeepJetStream(b)
	pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: url, Stream: stream, Subjects: []string{subject}})
	require.NoError(b, err)
	defer pub.Close()
	bench(b, &topicOverride{pub: pub, topic: subject})
	purgeNATSStream(b, url, stream)
}

func BenchmarkStreamGoChannel(b *testing.B) {
	ps := ackingGoChannel(b)
	defer ps.Close()
	benchStream(b, ps)
}

func BenchmarkStreamNATS(b *testing.B) {
	withNATS(b, "PGWAKE_BENCH_EVENTS", "pgwake.bench.events", benchStream)
}

// topicOverride publishes everything to one topic.
type topicOverride struct {
	pub   message.Publisher
	topic string
}

func (t *topicOverride) Publish(_ string, msgs ...*message.Message) error {
	return t.pub.Publish(t.topic, msgs...)
}
func (t *topicOverride) Close() error { return nil }

// BenchmarkQueueJobs is the queue's own throughput on the same machine, for
// comparison: b.N jobs enqueued in batches, then drained by 8 workers; each
// job writes two events (enqueued, succeeded).
func BenchmarkQueueJobs(b *testing.B) {
	e := eventstest.NewEnv(b)
	ctx := context.Background()
	c := e.QueueClient(8)
	jobs := make([]queue.NewJob, 1000)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "ok"}
	}
	for i := 0; i < b.N; i += len(jobs) {
		_, err := c.EnqueueMany(ctx, jobs[:min(len(jobs), b.N-i)])
		require.NoError(b, err)
	}
	b.ResetTimer()
	start := time.Now()
	stop := e.RunQueue(c)
	eventstest.WaitFor(b, 10*time.Minute, "jobs done", func() bool { return e.PendingJobs() == 0 })
	elapsed := time.Since(start)
	b.StopTimer()
	stop()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
	b.ReportMetric(float64(2*b.N)/elapsed.Seconds(), "events/s")
}

func purgeNATSStream(b *testing.B, url, stream string) {
	nc, err := nats.Connect(url)
	require.NoError(b, err)
	defer nc.Close()
	js, err := nc.JetStream()
	require.NoError(b, err)
	_ = js.DeleteStream(stream)
}

// BenchmarkQueueWithStream runs the queue at full speed (as
// BenchmarkQueueJobs) while the stream forwards its events into the Go
// channel: does the stream keep up? It reports the queue's jobs/s and the
// stream's events/s (the jobs' succeeded events, until the last was
// acknowledged), the slot lag when the queue finished, and how long the
// stream needed after that to catch up.
func BenchmarkQueueWithStream(b *testing.B) {
	ps := ackingGoChannel(b)
	defer ps.Close()
	benchQueueWithStream(b, ps)
}

// BenchmarkQueueWithStreamNATS is BenchmarkQueueWithStream into NATS
// JetStream.
func BenchmarkQueueWithStreamNATS(b *testing.B) {
	withNATS(b, "PGWAKE_BENCH_QUEUE_EVENTS", "pgwake.benchq.events", benchQueueWithStream)
}

func benchQueueWithStream(b *testing.B, ps message.Publisher) {
	e := eventstest.NewEnv(b)
	ctx := context.Background()
	cfg := e.Config(ps)
	cfg.StatusInterval = time.Second
	s, _ := e.RunStream(cfg)
	c := e.QueueClient(8)
	jobs := make([]queue.NewJob, 1000)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "ok"}
	}
	for i := 0; i < b.N; i += len(jobs) {
		_, err := c.EnqueueMany(ctx, jobs[:min(len(jobs), b.N-i)])
		require.NoError(b, err)
	}
	// As in BenchmarkQueueJobs the clock starts with the jobs in the table,
	// and the stream has forwarded their enqueued events.
	waitAcked(b, e, s)
	b.ResetTimer()
	start := time.Now()
	stop := e.RunQueue(c)
	eventstest.WaitFor(b, 10*time.Minute, "jobs done", func() bool { return e.PendingJobs() == 0 })
	queueDone := time.Since(start)
	var target string
	var lag int64
	require.NoError(b, e.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, (SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1)`, e.Slot).Scan(&target, &lag))
	end, err := pglogrepl.ParseLSN(target)
	require.NoError(b, err)
	eventstest.WaitFor(b, 10*time.Minute, "stream caught up", func() bool { return s.Acked() >= end })
	streamDone := time.Since(start)
	b.StopTimer()
	stop()
	b.ReportMetric(float64(b.N)/queueDone.Seconds(), "jobs/s")
	b.ReportMetric(float64(b.N)/streamDone.Seconds(), "stream-events/s")
	b.ReportMetric(float64(lag), "lag-bytes-at-queue-end")
	b.ReportMetric((streamDone - queueDone).Seconds(), "catch-up-s")
}

// waitAcked waits until the stream acknowledged the current WAL position.
func waitAcked(b *testing.B, e *env, s *events.Stream) {
	var target string
	require.NoError(b, e.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&target))
	end, err := pglogrepl.ParseLSN(target)
	require.NoError(b, err)
	eventstest.WaitFor(b, 10*time.Minute, "stream caught up", func() bool { return s.Acked() >= end })
}
