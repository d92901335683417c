package pubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
)

func TestTmpReconnectNoRestart(t *testing.T) {
	c := &conformance{schemas: map[string]string{}}
	c.pool = pgtest.NewPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 100 })
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Second):
			}
			c.mu.Lock()
			var schema string
			for _, s := range c.schemas {
				schema = s
			}
			c.mu.Unlock()
			if schema == "" {
				continue
			}
			var pending, done int
			_ = c.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE state='pending'), count(*) FILTER (WHERE state='succeeded') FROM `+sqlident.Quote(schema, "jobs")).Scan(&pending, &done)
			t.Logf("pending %d done %d", pending, done)
		}
	}()
	defer close(stop)
	tests.TestReconnect(t, tests.TestContext{TestID: tests.NewTestID(), Features: tests.Features{RestartServiceCommand: []string{"true"}, Persistent: true}},
		func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, "") })
}
