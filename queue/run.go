package queue

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"go.uber.org/zap"

	"github.com/pgwake/pgwake/notify"
)

// Run works the configured queues until ctx is cancelled, then stops
// claiming, lets running handlers finish for up to ShutdownTimeout, cancels
// the rest (their failures are recorded like any other) and returns once
// every goroutine it started has ended.
func (c *Client) Run(ctx context.Context) error {
	if len(c.loops) == 0 {
		return ErrNoQueues
	}
	if !c.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer c.running.Store(false)

	// Handlers get hardCtx, which outlives ctx by up to ShutdownTimeout.
	hardCtx, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hardCancel()

	var bg sync.WaitGroup
	listener := c.cfg.Listener
	lctx, lcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer func() { lcancel(); bg.Wait() }()
	if listener == nil {
		cc := c.cfg.ListenerConnConfig
		if cc == nil {
			cc = c.pool.Config().ConnConfig
		}
		l, err := notify.New(notify.Config{ConnConfig: cc, Logger: c.log, Registerer: c.metrics.listenerRegisterer()})
		if err != nil {
			return fmt.Errorf("queue: start listener: %w", err)
		}
		listener = l
		bg.Go(func() { _ = l.Run(lctx) })
	}
	unsubscribe, err := listener.Subscribe(c.channel, c.onNotify)
	if err != nil {
		return fmt.Errorf("queue: subscribe to %s: %w", c.channel, err)
	}
	defer unsubscribe()

	c.claimIdleTimeout = c.claimIdleTimeoutFor(ctx)
	c.log.Info("workers starting", zap.Int("queues", len(c.loops)), zap.String("client_id", c.id))
	bg.Go(func() { c.heartbeat(lctx) })
	bg.Go(func() { c.cleaner(lctx) })
	// Until the handlers are done, not only until ctx: running leased jobs
	// keep their leases through the shutdown deadline.
	leaseCtx, leaseStop := context.WithCancel(context.WithoutCancel(ctx))
	defer leaseStop()
	if len(c.cfg.LeasedKinds) > 0 {
		bg.Go(func() { c.leaseLoop(leaseCtx) })
	}
	defer c.dropWaiters()
	var loops sync.WaitGroup
	for _, l := range c.loops {
		loops.Go(func() { l.dispatch(ctx, hardCtx) })
	}
	loops.Wait() // dispatchers return when ctx is done

	// Let running handlers finish, up to the deadline.
	done := make(chan struct{})
	go func() {
		for _, l := range c.loops {
			l.handlers.Wait()
		}
		close(done)
	}()
	t := time.NewTimer(c.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		c.log.Warn("shutdown timeout: cancelling running handlers", zap.Duration("timeout", c.cfg.ShutdownTimeout))
		hardCancel()
		<-done
	}
	leaseStop()
	c.log.Info("workers stopped")
	return nil
}

// heartbeatEvery is how often a running client refreshes its waiter rows and
// prunes stale waiter and attempt rows.
const heartbeatEvery = 20 * time.Second

// heartbeat keeps this client's waiter rows fresh (producers ignore rows
// older than 90s, so a killed process stops drawing NOTIFYs) and prunes the
// rows of clients long gone.
func (c *Client) heartbeat(ctx context.Context) {
	queues := make([]string, 0, len(c.loops))
	for q := range c.loops {
		queues = append(queues, q)
	}
	every(ctx, heartbeatEvery, func() {
		c.wakeForLost(ctx)
		for _, st := range []struct {
			what string
			sql  string
			args []any
		}{
			{"waiter heartbeat", c.sql.heartbeat, []any{queues, c.id}},
			{"pruning waiters", c.sql.pruneWaiters, nil},
			{"pruning attempt records", c.sql.pruneStarts, nil},
		} {
			if _, err := c.pool.Exec(ctx, st.sql, st.args...); err != nil && ctx.Err() == nil {
				c.log.Warn(st.what+" failed", zap.Error(err))
			}
		}
	})
}

// wakeForLost sends every loop whose queue has attempt records older than
// a few seconds to look for lost attempts: a release signal can be missed
// (the database was down when the loop looked, or the dead claim's backend
// still held its locks), and a sleeping loop would not look again for a
// PollInterval.
func (c *Client) wakeForLost(ctx context.Context) {
	rows, err := c.pool.Query(ctx, c.sql.lostQueues)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("looking for lost attempts failed", zap.Error(err))
		}
		return
	}
	queues, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, q := range queues {
		if l, ok := c.loops[q]; ok {
			l.wake(sourceReleased, 0)
		}
	}
}

// every calls f every d (first after d) until ctx is done.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// sleep waits d or until ctx is done; false means ctx is done.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// idleMargin is how much longer than the longest job timeout a claim
// transaction may sit idle before the server ends it.
const idleMargin = 30 * time.Second

// claimIdleTimeoutFor decides what the claim transactions set as their
// idle_in_transaction_session_timeout. A handler working outside the
// database (an HTTP call, an exec handler's command) leaves its claim
// transaction idle; a server or role setting shorter than the job timeout
// would end the session under it. So when the pool's setting is shorter than
// the longest job timeout plus idleMargin (or any kind has no timeout), each
// claim lifts it for its own transaction, one more statement in the claim's
// round trip; otherwise (the default, 0: no limit) nothing is sent. ""
// means nothing to set.
func (c *Client) claimIdleTimeoutFor(ctx context.Context) string {
	longest := c.cfg.JobTimeout
	for kind := range c.cfg.Handlers {
		if d := c.cfg.timeout(kind); d < 0 || longest < 0 {
			longest = -1
		} else {
			longest = max(longest, d)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a stalled database must not hold up Run
	defer cancel()
	var ms int64
	err := c.pool.QueryRow(ctx, `SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'idle_in_transaction_session_timeout'`).Scan(&ms)
	if err != nil {
		// Unknown: set it, which is always safe.
		c.log.Warn("could not read idle_in_transaction_session_timeout; claims will set it", zap.Error(err))
		ms = 1
	}
	switch {
	case ms == 0:
		return ""
	case longest < 0:
		return "0"
	case time.Duration(ms)*time.Millisecond >= longest+idleMargin:
		return ""
	}
	return strconv.FormatInt((longest + idleMargin).Milliseconds(), 10)
}
