package events_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/natsbridge"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// Forward the event log to NATS JetStream, one subject per queue, until ctx
// is done. Run it in one process per slot; it resumes from the slot after
// any restart.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: "nats://127.0.0.1:4222"})
	if err != nil {
		log.Fatal(err) // natsbridge.ErrUnreachable names the URL
	}
	defer pub.Close()
	s, err := events.New(pool, events.Config{
		Schema:     "pgwake",
		Publisher:  pub,
		Topic:      events.TopicPerQueue("pgwake.events"),
		Registerer: prometheus.DefaultRegisterer,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Run(ctx); err != nil {
		log.Fatal(err) // wal_level, privileges, publication: says how to fix it
	}
}

// A consumer that starts late: subscribe to the live messages first, then
// backfill from the table, then drop the live duplicates of the backfill.
// Here no Stream publishes to ps, so the live loop ends when its context
// does; in a program a Stream in the same process publishes to ps and the
// loop runs for as long as the consumer does.
func ExampleBackfill() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL()) // os.Getenv("DATABASE_URL") in a program
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	const schema = "pgwake_example_backfill"
	client, err := queue.New(pool, queue.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := client.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	job, err := client.Enqueue(ctx, queue.NewJob{Kind: "welcome", Payload: map[string]string{"to": "ann@example.com"}})
	if err != nil {
		log.Fatal(err)
	}

	liveCtx, stop := context.WithTimeout(ctx, 100*time.Millisecond)
	defer stop()
	ps := events.NewGoChannel(nil)                      // a Stream in this process publishes to ps
	live, err := ps.Subscribe(liveCtx, "pgwake.events") // 1. live first (buffered by the channel)
	if err != nil {
		log.Fatal(err)
	}
	handle := func(e events.Event) {
		if e.JobID == job.ID { // this example's job, whatever else the schema holds
			fmt.Println(e.Type, e.Kind)
		}
	}
	cu, err := events.Backfill(ctx, pool, schema, events.From{}, func(e events.Event) error { // 2. backfill
		handle(e)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	for msg := range live { // 3. live, without what the backfill delivered
		id, _ := events.MessageEventID(msg)
		lsn, _ := events.MessageLSN(msg)
		if cu.Live(id, lsn) {
			e, err := events.Decode(msg.Payload)
			if err == nil {
				handle(e)
			}
		}
		msg.Ack()
	}
	// Output: enqueued welcome
}

// databaseURL is the examples' database: the test binary's own server
// (internal/pgtest) when they run as tests.
func databaseURL() string { return pgtest.URL() }
