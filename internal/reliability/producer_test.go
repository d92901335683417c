package reliability

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// orphanKind marks the jobs a dying producer enqueues.
const orphanKind = "orphan"

// producerMain begins a transaction, enqueues jobs in it (one EnqueueTx and
// one EnqueueManyTx of 50), prints their ids and waits to be killed.
func producerMain() int {
	ctx := context.Background()
	pool, err := helperPool(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	c, err := queue.New(pool, queue.Config{Schema: os.Getenv("PGWAKE_RELIABILITY_SCHEMA")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	r, err := c.EnqueueTx(ctx, tx, queue.NewJob{Kind: orphanKind, UniqueKey: "orphan-single"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	jobs := make([]queue.NewJob, 50)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: orphanKind, Payload: map[string]int{"i": i}}
	}
	rs, err := c.EnqueueManyTx(ctx, tx, jobs)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	ids := []string{fmt.Sprint(r.ID)}
	for _, r := range rs {
		ids = append(ids, fmt.Sprint(r.ID))
	}
	fmt.Println("enqueued " + strings.Join(ids, ","))
	select {} // killed before the commit
}

// TestProducerKilledBeforeCommit kills producers that have enqueued in an
// open transaction: no job and no event of theirs exist afterwards, their
// unique key is free, and a worker that slept through it all (its poll
// interval is an hour) is still woken by the next enqueue, so the dead
// producer's advisory lock did not strand the worker either.
func TestProducerKilledBeforeCommit(t *testing.T) {
	w := newWorld(t, false)
	ran := make(chan int64, 100)
	pool := w.pool(appWorker, 8)
	c, err := queue.New(pool, queue.Config{
		Schema:       w.schema,
		Queues:       map[string]queue.QueueConfig{workQueue: {MaxWorkers: 2}},
		PollInterval: time.Hour,
		Handlers: map[string]queue.Handler{
			orphanKind: queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error { ran <- j.ID; return nil }),
			"probe":    queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error { ran <- j.ID; return nil }),
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	const rounds = 3
	for round := range rounds {
		app := fmt.Sprintf("%s_dying_%d", appProducer, round)
		h, line := w.startHelper("producer", app)
		require.True(t, strings.HasPrefix(line, "enqueued "), "helper said %q", line)
		// While the producer lives its rows are invisible: nothing runs.
		require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")))
		h.kill()
		// The backend notices the closed socket and rolls back.
		deadline := time.Now().Add(time.Minute)
		for w.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app) > 0 {
			require.True(t, time.Now().Before(deadline), "backend of the killed producer still there")
			time.Sleep(20 * time.Millisecond)
		}
		require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")), "jobs of a killed producer")
		require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("events")), "events of a killed producer")
	}
	select {
	case id := <-ran:
		t.Fatalf("job %d of a killed producer ran", id)
	default:
	}

	// The unique key the dead producers used is free; the sleeping worker
	// is woken by a notification and runs the probe.
	r, err := c.Enqueue(context.Background(), queue.NewJob{Kind: "probe", UniqueKey: "orphan-single"})
	require.NoError(t, err)
	require.False(t, r.Duplicate)
	select {
	case id := <-ran:
		require.Equal(t, r.ID, id)
	case <-time.After(time.Minute):
		t.Fatal("the probe job did not run: the worker was not woken")
	}
	t.Logf("RESULT %s: producers_killed=%d jobs=0 orphan_jobs=0 orphan_events=0 probe_woken_by_notify=true", t.Name(), rounds)
}
