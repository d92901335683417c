package queue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/backoff"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/notify"
)

// Run works the configured queues until ctx is cancelled, then stops
// claiming, lets running handlers finish for up to ShutdownTimeout, cancels
// the rest (their failures are recorded like any other) and returns once
// every goroutine it started has ended. Startup errors (a schema without
// every migration, a listener that cannot start) are returned at once.
func (c *Client) Run(ctx context.Context) error {
	r, err := c.startup(ctx)
	if err != nil {
		return err
	}
	return r.serve(ctx, func() <-chan struct{} {
		expired := make(chan struct{})
		time.AfterFunc(c.cfg.ShutdownTimeout, func() { close(expired) })
		return expired
	})
}

// Start is Run for a service with a start and a stop: it checks the schema,
// starts the LISTEN connection and waits until it listens (ctx bounds this
// wait; a listener that cannot connect in time is an error), starts the
// workers and returns. Startup errors are returned, not logged. Stop ends
// the workers. ctx bounds the startup only.
func (c *Client) Start(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	st := &started{cancel: cancel, done: make(chan struct{}), deadline: make(chan (<-chan struct{}), 1), ready: make(chan struct{})}
	c.mu.Lock()
	if c.started != nil {
		c.mu.Unlock()
		cancel()
		return ErrAlreadyRunning
	}
	// Set before the startup, so that a Stop meanwhile waits for it and
	// stops what it started (TestStopDuringStart).
	c.started = st
	c.mu.Unlock()
	defer close(st.ready)
	// The startup ends when ctx does (its statements are bounded by it, as
	// the doc says: TestStartIsBoundedByItsContext) or when a Stop cuts it
	// short; what it starts runs on runCtx.
	sctx, scancel := context.WithCancel(runCtx)
	unhook := context.AfterFunc(ctx, scancel)
	r, err := c.startup(sctx)
	unhook()
	scancel()
	if err == nil && ctx.Err() != nil {
		// The startup's statements gave up when ctx ended.
		r.stopBackground()
		c.running.Store(false)
		err = fmt.Errorf("queue: start: %w", context.Cause(ctx))
	}
	if err == nil {
		if err = r.waitListening(ctx); err != nil {
			r.stopBackground()
			c.running.Store(false)
		}
	}
	if err != nil {
		cancel()
		st.failed = true
		c.mu.Lock()
		if c.started == st {
			c.started = nil
		}
		c.mu.Unlock()
		return err
	}
	go func() {
		defer close(st.done)
		// Stop's context is the deadline for running handlers.
		st.err = r.serve(runCtx, func() <-chan struct{} { return <-st.deadline })
	}()
	return nil
}

// Stop ends workers started by Start: it stops claiming, lets running
// handlers finish until ctx is done, cancels the rest (their failures are
// recorded like any other), waits for every goroutine Start started and
// returns what Run would have. ErrNotStarted if Start did not succeed (or
// Stop already ran). A Start still starting is waited for (and cut short
// when ctx ends first), then stopped.
//
// Called from one of the client's handlers (ctx derived from the handler's),
// Stop cannot wait for that handler: it stops claiming, lets every running
// handler finish (the caller's when it returns) and returns
// ErrStopInHandler at once instead of waiting for ever.
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	st := c.started
	c.started = nil
	c.mu.Unlock()
	if st == nil {
		return ErrNotStarted
	}
	select {
	case <-st.ready:
	case <-ctx.Done():
		st.cancel() // the startup ends early
		<-st.ready
	}
	if st.failed {
		return ErrNotStarted
	}
	if ctx.Value(handlerCtxKey{}) == c {
		st.deadline <- nil // no deadline: the caller is one of the handlers
		st.cancel()
		return ErrStopInHandler
	}
	st.deadline <- ctx.Done()
	st.cancel()
	<-st.done
	return st.err
}

// handlerCtxKey is the key of the client in its handlers' contexts.
type handlerCtxKey struct{}

// started is the state of workers started by Start.
type started struct {
	cancel   context.CancelFunc
	deadline chan (<-chan struct{}) // Stop's ctx.Done()
	done     chan struct{}          // closed when serve returned
	err      error                  // serve's result, once done is closed
	ready    chan struct{}          // closed when Start returns
	failed   bool                   // Start returned an error (read after ready)
}

// runner is a started client: its listener, background goroutines and the
// context its handlers run on.
type runner struct {
	c          *Client
	listener   *notify.Listener
	bg         sync.WaitGroup
	lcancel    context.CancelFunc // listener, heartbeat, cleaner
	hardCtx    context.Context    // handlers: outlives the run's ctx by the shutdown deadline
	hardCancel context.CancelFunc
	unsub      func()
}

// startup checks that the client can run and starts the listener; on error
// nothing is left running.
func (c *Client) startup(ctx context.Context) (_ *runner, err error) {
	if len(c.loops) == 0 && len(c.cfg.Periodic) == 0 {
		return nil, ErrNoQueues
	}
	if !c.running.CompareAndSwap(false, true) {
		return nil, ErrAlreadyRunning
	}
	r := &runner{c: c}
	var lctx context.Context
	lctx, r.lcancel = context.WithCancel(context.WithoutCancel(ctx))
	// The handlers' contexts carry the client: Stop sees it called from one.
	r.hardCtx, r.hardCancel = context.WithCancel(context.WithValue(context.WithoutCancel(ctx), handlerCtxKey{}, c))
	defer func() {
		if err != nil {
			r.stopBackground()
			c.running.Store(false)
		}
	}()
	if err := c.retryAtStart(ctx, c.checkSchema); err != nil {
		return nil, err
	}
	r.listener = c.cfg.Listener
	if r.listener == nil {
		cc := c.cfg.ListenerConnConfig
		if cc == nil {
			cc = c.pool.Config().ConnConfig
		}
		l, err := notify.New(notify.Config{ConnConfig: cc, Logger: c.log, Registerer: c.metrics.listenerRegisterer()})
		if err != nil {
			return nil, fmt.Errorf("queue: start listener: %w", err)
		}
		r.listener = l
		r.bg.Go(func() { _ = l.Run(lctx) })
	}
	if r.unsub, err = r.listener.Subscribe(c.channel, c.onNotify); err != nil {
		return nil, fmt.Errorf("queue: subscribe to %s: %w", c.channel, err)
	}
	c.claimIdleTimeout = c.claimIdleTimeoutFor(ctx)
	if err := c.retryAtStart(ctx, c.loadPaused); err != nil && ctx.Err() == nil {
		return nil, err // stopped meanwhile: Run returns as from a stop
	}
	c.warmPool(ctx)
	return r, nil
}

// startAttempts bounds the tries of a statement Start runs that failed
// for another reason than a lost connection.
const startAttempts = 4

// retryAtStart runs f until it succeeds or ctx is done. A pooled connection
// that the server closed (a restart, a terminated backend) fails its first
// use and leaves the pool, so f runs again at once, up to one more time than
// the pool has connections. Other errors are tried startAttempts times,
// backing off 50 ms, then 100 ms, then 200 ms, and a lasting fault (a
// missing migration, a privilege) is returned after the last try.
func (c *Client) retryAtStart(ctx context.Context, f func(context.Context) error) error {
	lost, failed := 0, 0
	for {
		err := f(ctx)
		if err == nil || ctx.Err() != nil || errors.Is(err, ErrSchemaNotMigrated) {
			return err
		}
		if connectionLost(err) && lost <= int(c.pool.Config().MaxConns) {
			lost++
			continue
		}
		if failed++; failed == startAttempts {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff.Exponential(failed, 50*time.Millisecond, time.Second)):
		}
	}
}

// connectionLost reports whether err says the connection was closed by the
// server or the network (SQLSTATE class 08, or 57P01-57P03: terminated,
// shut down, cannot connect now) rather than that the statement failed.
func connectionLost(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	return pgconn.SafeToRetry(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// stopBackground ends the listener subscription and the background
// goroutines and waits for them.
func (r *runner) stopBackground() {
	if r.unsub != nil {
		r.unsub()
	}
	r.lcancel()
	r.bg.Wait()
	r.hardCancel()
}

// waitListening waits until the listener is connected, or ctx ends.
func (r *runner) waitListening(ctx context.Context) error {
	for !r.listener.Connected() {
		if !sleep(ctx, 5*time.Millisecond) {
			return fmt.Errorf("queue: start: the LISTEN connection did not connect: %w", context.Cause(ctx))
		}
	}
	return nil
}

// serve runs the dispatchers until ctx is done, then lets running handlers
// finish until the channel deadline() returns fires, cancels the rest, and
// stops everything startup started.
func (r *runner) serve(ctx context.Context, deadline func() <-chan struct{}) error {
	c := r.c
	defer c.running.Store(false)
	defer r.stopBackground()
	lctx, lcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer lcancel()
	c.log.Info("workers starting", zap.Int("queues", len(c.loops)), zap.String("client_id", c.id))
	r.bg.Go(func() { c.heartbeat(lctx) })
	r.bg.Go(func() { c.cleaner(lctx) })
	r.bg.Go(func() { c.pausePoll(lctx) })
	// Until the handlers are done, not only until ctx: running leased jobs
	// keep their leases through the shutdown deadline.
	leaseCtx, leaseStop := context.WithCancel(context.WithoutCancel(ctx))
	defer leaseStop()
	if len(c.cfg.LeasedKinds) > 0 {
		r.bg.Go(func() { c.leaseLoop(leaseCtx) })
	}
	defer c.dropWaiters()
	var loops sync.WaitGroup
	for _, l := range c.loops {
		loops.Add(1) // done when the loop ends, in whichever goroutine (handOver)
		go l.dispatch(ctx, r.hardCtx, loops.Done)
	}
	loops.Go(func() { c.runPeriodic(ctx) })
	loops.Wait() // dispatchers return when ctx is done
	if ts := c.signals; ts != nil {
		ts.draining.signal(struct{}{})
	}

	// Let running handlers finish, up to the deadline.
	done := make(chan struct{})
	go func() {
		for _, l := range c.loops {
			l.handlers.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-deadline():
		c.log.Warn("shutdown deadline: cancelling running handlers")
		r.hardCancel()
		<-done
	}
	leaseStop()
	lcancel()
	c.log.Info("workers stopped")
	return nil
}

// checkSchema returns ErrSchemaNotMigrated when the schema lacks a
// migration this version of pgwake needs. A role that may not read the
// migrations table is not stopped (its statements will say what is wrong).
func (c *Client) checkSchema(parent context.Context) error {
	ctx, cancel := context.WithTimeout(parent, 10*time.Second)
	defer cancel()
	st, err := migrations.StatusOf(ctx, c.pool, c.cfg.Schema)
	if err != nil && parent.Err() != nil {
		return nil // stopped before it started: Run returns as from a stop
	}
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			c.log.Warn("cannot check the schema's migrations", zap.Error(err))
			return nil
		}
		return fmt.Errorf("queue: check schema %s: %w", c.cfg.Schema, err)
	}
	missing := migrations.Pending(st)
	if len(missing) > 0 {
		return fmt.Errorf("%w: schema %s lacks migration(s) %s: run pgwake migrate, or Client.Migrate",
			ErrSchemaNotMigrated, c.cfg.Schema, strings.Join(missing, ", "))
	}
	return nil
}

// notMigrated marks err, from one of pgwake's own statements, as
// ErrSchemaNotMigrated when the server said that a schema, table, column
// or function is missing: a producer deployed before its migration, or
// pointed at the wrong schema (TestEnqueueOnAnOlderSchema). Other errors
// are returned as they are.
func (c *Client) notMigrated(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "3F000", "42P01", "42703", "42883": // invalid_schema_name, undefined_table, _column, _function
		return fmt.Errorf("%w: schema %s: run pgwake migrate, or Client.Migrate: %w", ErrSchemaNotMigrated, c.cfg.Schema, err)
	}
	return err
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
	// A client without leased kinds still rescues its queues' expired
	// leases, a PollInterval after its start (not at once: Start's warm-up
	// holds the connections then, and the rescue would open a cold one the
	// first job may get: TestStartReadiesTheConnectionsItOpens) and then
	// every heartbeat (leaseLoop does it every LeaseDuration/3 for the
	// others): a kind taken out of LeasedKinds, or its only leased workers
	// dead (TestExpiredLeaseRescuedByAHeldWorker).
	rescue := len(c.cfg.LeasedKinds) == 0
	if rescue && sleep(ctx, c.cfg.PollInterval) {
		c.rescueExpired(ctx, c.pool, queues)
	}
	every(ctx, heartbeatEvery, func() {
		c.wakeForLost(ctx)
		if rescue {
			c.rescueExpired(ctx, c.pool, queues)
		}
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

// maxIdleTimeout is the largest idle_in_transaction_session_timeout
// PostgreSQL accepts: INT_MAX milliseconds.
const maxIdleTimeout = math.MaxInt32 * time.Millisecond

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
	case longest < 0 || longest > maxIdleTimeout-idleMargin:
		// No limit, or one beyond what the setting holds (INT_MAX ms, about
		// 24.8 days; and longest+idleMargin would wrap near MaxInt64):
		// no limit for the claim's own transaction
		// (TestHugeJobTimeoutUnderServerIdleTimeout).
		return "0"
	case time.Duration(ms)*time.Millisecond >= longest+idleMargin:
		return ""
	}
	return strconv.FormatInt((longest + idleMargin).Milliseconds(), 10)
}
