package events_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
)

// A LagInterval of a nanosecond ran the lag query without pause (322 pool
// acquires in 2 s of an idle stream), a nanosecond StatusInterval sent a
// status update at every turn, and nanosecond backoffs retried without
// pause. New refuses them; at the floors an idle stream stays quiet.
func TestTinyStreamIntervalsAreRefused(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, nil)
	e := newEnvOn(t, pool)
	ps := events.NewGoChannel(nil)
	defer ps.Close()
	for _, set := range []func(*events.Config){
		func(c *events.Config) { c.LagInterval = time.Nanosecond },
		func(c *events.Config) { c.StatusInterval = time.Nanosecond },
		func(c *events.Config) { c.MinBackoff = time.Nanosecond },
		func(c *events.Config) { c.MinBackoff, c.MaxBackoff = time.Nanosecond, time.Nanosecond },
	} {
		cfg := e.Config(ps)
		set(&cfg)
		_, err := events.New(pool, cfg)
		require.ErrorIs(t, err, events.ErrInvalidConfig)
	}
	cfg := e.Config(ps)
	cfg.LagInterval, cfg.StatusInterval = events.MinLagInterval, events.MinStatusInterval
	cfg.MinBackoff, cfg.MaxBackoff = events.MinMinBackoff, events.MinMinBackoff
	_, stop := e.RunStream(cfg)
	a0 := pool.Stat().AcquireCount()
	time.Sleep(2 * time.Second)
	a1 := pool.Stat().AcquireCount()
	stop()
	// One lag query per 100 ms: 20, and a margin.
	require.Less(t, a1-a0, int64(60), "pool acquires in 2 s of an idle stream")
}
