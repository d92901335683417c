package queue_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// Start's ctx bounds the startup (its doc): against a server that accepts
// connections and never answers, Start(ctx) returns ctx's error when ctx
// ends. Before, the schema check ran on a context Start's ctx did not
// reach, and Start with a 1 s deadline was still waiting 15 s later.
func TestStartIsBoundedByItsContext(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // never answered
		}
	}()
	pcfg, err := pgxpool.ParseConfig("postgres://u@" + ln.Addr().String() + "/db?sslmode=disable&pool_max_conns=20")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	defer pool.Close()
	c, err := queue.New(pool, queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"x": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Start(ctx) }()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(15 * time.Second):
		t.Fatal("Start(ctx with a 1 s deadline) had not returned 15 s later")
	}
	require.ErrorIs(t, c.Stop(context.Background()), queue.ErrNotStarted)
}
