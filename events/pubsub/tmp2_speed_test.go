package pubsub_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/pgtest"
)

func TestTmpReconnectNoRestart(t *testing.T) {
	c := &conformance{schemas: map[string]string{}}
	c.pool = pgtest.NewPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 100 })
	tests.TestReconnect(t, tests.TestContext{TestID: tests.NewTestID(), Features: tests.Features{RestartServiceCommand: []string{"true"}, Persistent: true}},
		func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, "") })
}
