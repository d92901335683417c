package queue_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// Enqueue a job in the same transaction as the caller's own write: the job
// exists exactly when the order does.
func ExampleClient_EnqueueTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	client, err := queue.New(pool, queue.Config{Schema: "pgwake"})
	if err != nil {
		panic(err)
	}
	// Migrate the client's own schema: it is named once, in Config.
	if _, err := client.Migrate(ctx); err != nil {
		panic(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, 42); err != nil {
			return err
		}
		_, err := client.EnqueueTx(ctx, tx, queue.NewJob{
			Kind:    "send_receipt",
			Payload: map[string]any{"order_id": 42},
		})
		return err
	})
	if err != nil {
		panic(err)
	}
}

// Run workers: each handler gets the claim transaction, so its writes commit
// exactly when the job completes.
func ExampleClient_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cfg := queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 10}},
		Handlers: map[string]queue.Handler{
			"send_receipt": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job *queue.Job) error {
				_, err := tx.Exec(ctx, `UPDATE orders SET receipt_sent = true WHERE id = ($1::jsonb->>'order_id')::int`, job.Payload)
				return err
			}),
		},
		KindTimeouts: map[string]time.Duration{"send_receipt": 30 * time.Second},
	}
	// Every running job holds a connection: size the pool for the workers
	// (queue.New refuses fewer), plus room for the application.
	pcfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	pcfg.MaxConns = int32(queue.MinPoolConns(cfg) + 4)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	client, err := queue.New(pool, cfg)
	if err != nil {
		panic(err)
	}
	if err := client.Run(ctx); err != nil { // returns after a graceful drain
		log.Fatal(err) // a startup error: the schema, the listener
	}
}

// Size a pool for the workers: one connection per worker slot, one per
// queue, one for pgwake's bookkeeping.
func ExampleMinPoolConns() {
	cfg := queue.Config{Queues: map[string]queue.QueueConfig{
		"default":  {MaxWorkers: 10},
		"critical": {MaxWorkers: 4},
	}}
	fmt.Println(queue.MinPoolConns(cfg))
	// Output: 17
}

// Periodic jobs: every process that runs this config works the schedule,
// and each slot gets exactly one job, with run_after at the slot. This one
// stops after the first job of its one-second tick.
func ExampleConfig_periodic() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool, err := pgxpool.New(ctx, databaseURL()) // os.Getenv("DATABASE_URL") in a program
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	var first sync.Once
	client, err := queue.New(pool, queue.Config{
		Schema: "pgwake_example_periodic",
		// Within pgxpool's default pool (4 connections on a small machine):
		// see MinPoolConns.
		Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{
			"report": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job *queue.Job) error {
				first.Do(func() {
					fmt.Println(job.Kind, "for a slot on a whole second:", job.RunAfter.Equal(job.RunAfter.Truncate(time.Second)))
					stop() // Run drains and returns
				})
				return nil
			}),
		},
		Periodic: []queue.PeriodicJob{
			{Name: "nightly", Spec: "0 2 * * *", Job: queue.NewJob{Kind: "report"}}, // 02:00 UTC daily
			{Name: "tick", Spec: "@every 1s", Job: queue.NewJob{Kind: "report"}, SkipMissed: true},
		},
	})
	if err != nil {
		panic(err)
	}
	if _, err := client.Migrate(ctx); err != nil {
		panic(err)
	}
	if err := client.Run(ctx); err != nil {
		panic(err)
	}
	// Output: report for a slot on a whole second: true
}

// Pause a queue in every process: enqueues still go in, nothing is claimed
// until ResumeQueue.
func ExampleClient_PauseQueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL()) // os.Getenv("DATABASE_URL") in a program
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	client, err := queue.New(pool, queue.Config{Schema: "pgwake_example_pause"})
	if err != nil {
		panic(err)
	}
	if _, err := client.Migrate(ctx); err != nil {
		panic(err)
	}
	if err := client.PauseQueue(ctx, "email"); err != nil {
		panic(err)
	}
	queues, err := client.Queues(ctx)
	if err != nil {
		panic(err)
	}
	for _, q := range queues {
		fmt.Println(q.Queue, q.Paused)
	}
	if err := client.ResumeQueue(ctx, "email"); err != nil {
		panic(err)
	}
	// Output: email true
}

// databaseURL is the examples' database: the test binary's own server
// (internal/pgtest) when they run as tests.
func databaseURL() string { return pgtest.URL() }
