package queue

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/notify"
)

// Claim sources: why a worker looked at the database when it claimed a job.
// "poll" claims mean notifications were missed (or jobs were retried from
// another process's failure without its hint reaching us).
const (
	sourceStart     = "start"     // first look after Run started
	sourceNotify    = "notify"    // a NOTIFY for the queue
	sourceResync    = "resync"    // the listener (re)connected
	sourceScheduled = "scheduled" // the timer of a known delayed job fired
	sourcePoll      = "poll"      // the poll interval ran out
	sourceBusy      = "busy"      // the previous look found a job
	sourceReleased  = "released"  // a claim transaction of ours rolled back
	sourceRecheck   = "recheck"   // a short look while producers that skipped NOTIFY may be in flight
)

// Run works the configured queues until ctx is cancelled, then stops
// claiming, lets running handlers finish for up to ShutdownTimeout, cancels
// the rest (their transactions roll back and their jobs stay pending) and
// returns once every goroutine it started has ended.
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
	c.log.Info("workers stopped")
	return nil
}

// heartbeat keeps this client's waiter rows fresh (producers ignore rows
// older than 90s, so a killed process stops drawing NOTIFYs) and prunes the
// rows of clients long gone.
func (c *Client) heartbeat(ctx context.Context) {
	queues := make([]string, 0, len(c.loops))
	for q := range c.loops {
		queues = append(queues, q)
	}
	every(ctx, 20*time.Second, func() {
		if _, err := c.pool.Exec(ctx, c.sql.heartbeat, queues, c.id); err != nil && ctx.Err() == nil {
			c.log.Warn("waiter heartbeat failed", zap.Error(err))
		}
		if _, err := c.pool.Exec(ctx, c.sql.pruneWaiters); err != nil && ctx.Err() == nil {
			c.log.Warn("pruning waiters failed", zap.Error(err))
		}
	})
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

func (c *Client) dropWaiters() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.pool.Exec(ctx, c.sql.dropWaiters, c.id); err != nil {
		c.log.Warn("could not remove waiter rows; they expire in 90s", zap.Error(err))
	}
}

// onNotify routes a wake-up to the loop of its queue. It runs on the
// listener's goroutine and never blocks.
func (c *Client) onNotify(ev notify.Event) {
	if ev.Resync {
		for _, l := range c.loops {
			l.wake(sourceResync, 0)
		}
		return
	}
	queue, delay := parseWake(ev.Payload)
	if l, ok := c.loops[queue]; ok {
		l.wake(sourceNotify, delay)
	}
}

// maxHintDelay caps delays taken from the database or a wake payload, so far
// future jobs cannot overflow a time.Duration.
const maxHintDelay = 100 * 365 * 24 * time.Hour

// parseWake splits a wake payload "queue" or "queue|ms".
func parseWake(payload string) (queue string, delay time.Duration) {
	q, ms, ok := strings.Cut(payload, "|")
	if !ok {
		return payload, 0
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return q, 0
	}
	n = min(n, int64(maxHintDelay/time.Millisecond))
	return q, time.Duration(n) * time.Millisecond
}

// queueLoop claims and runs the jobs of one queue.
type queueLoop struct {
	c     *Client
	queue string
	slots chan struct{}

	signal chan struct{} // coalesced wake-ups
	mu     sync.Mutex
	now    string    // source of a pending "look now" wake-up, "" if none
	hintAt time.Time // earliest delayed job we heard of

	// avgNanos is a moving average of handler run time, for the batch size.
	avgNanos atomic.Int64

	handlers sync.WaitGroup
}

func newQueueLoop(c *Client, queue string, qc QueueConfig) *queueLoop {
	return &queueLoop{
		c:      c,
		queue:  queue,
		slots:  make(chan struct{}, qc.MaxWorkers),
		signal: make(chan struct{}, 1),
	}
}

// wake asks the loop to look now (delay 0) or to look by now+delay.
func (l *queueLoop) wake(source string, delay time.Duration) {
	l.mu.Lock()
	if delay <= 0 {
		if l.now == "" || source == sourceResync {
			l.now = source
		}
	} else if at := time.Now().Add(delay); l.hintAt.IsZero() || at.Before(l.hintAt) {
		l.hintAt = at
	}
	l.mu.Unlock()
	select {
	case l.signal <- struct{}{}:
	default:
	}
}

// takeWake returns the pending look-now source ("" if none) and the earliest
// delayed hint, clearing both.
func (l *queueLoop) takeWake() (string, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	src, at := l.now, l.hintAt
	l.now, l.hintAt = "", time.Time{}
	return src, at
}

// batchSize is how many jobs the next claim takes: enough fast jobs to fill
// about BatchTarget of handler time, one when handlers are slow or unknown.
func (l *queueLoop) batchSize() int {
	maxB := l.c.cfg.MaxBatch
	if maxB <= 1 {
		return 1
	}
	avg := l.avgNanos.Load()
	if avg <= 0 {
		return 1
	}
	n := int(int64(l.c.cfg.BatchTarget) / avg)
	return max(1, min(n, maxB))
}

func (l *queueLoop) observe(d time.Duration) {
	old := l.avgNanos.Load()
	if old == 0 {
		l.avgNanos.Store(int64(d))
		return
	}
	l.avgNanos.Store(old + (int64(d)-old)/8)
}

// Waiter states of a loop, as last written to the waiters table.
const (
	waiterUnknown = iota
	waiterBusy
	waiterMarked // marked idle, but producers that looked earlier may be in flight
	waiterIdle   // marked idle and the barrier passed: safe to sleep long
)

// markedRecheck is how often a loop marked idle but not yet past the barrier
// looks at the queue.
const markedRecheck = 25 * time.Millisecond

// dispatch is the loop: take a free slot, claim jobs, hand them to a handler
// goroutine; when nothing is due, mark the queue as waited on and sleep until
// a wake-up, the earliest known delayed job, or the poll interval.
func (l *queueLoop) dispatch(ctx, hardCtx context.Context) {
	log := l.c.log.Named("worker").With(zap.String("queue", l.queue))
	source := sourceStart
	var nextAt time.Time // earliest future run_after known
	errBackoff := 100 * time.Millisecond
	waiter := waiterUnknown
	var cursor *claimCursor // where the last claim ended, while a backlog lasts
	sinceHead := 0
	for {
		select {
		case <-ctx.Done():
			return
		case l.slots <- struct{}{}:
		}
		// Batch when there is a backlog (the last look found work, or every
		// slot is busy): one dispatcher claims for all slots, so one job per
		// claim would cap throughput at one round trip per job. The batch is
		// sized to BatchTarget of handler time, so slow handlers still get one
		// job each and run in parallel. A fresh wake-up takes one job.
		n := 1
		if source == sourceBusy || len(l.slots) == cap(l.slots) {
			n = l.batchSize()
		}
		var after *claimCursor
		if source == sourceBusy && cursor != nil && sinceHead < headEvery {
			after = cursor
			sinceHead++
		} else {
			sinceHead = 0
		}
		batch, next, err := l.c.claim(ctx, l.queue, n, after)
		cursor = nil
		if batch != nil {
			last := &batch.jobs[len(batch.jobs)-1].job
			cursor = &claimCursor{priority: int16(last.Priority), runAfter: last.RunAfter, id: last.ID}
		}
		if err != nil {
			<-l.slots
			if ctx.Err() != nil {
				return
			}
			log.Warn("claim failed", zap.Error(err), zap.Duration("backoff", errBackoff))
			l.c.metrics.claimErrors.WithLabelValues(l.queue).Inc()
			waiter = waiterUnknown
			if !sleep(ctx, errBackoff) {
				return
			}
			errBackoff = min(errBackoff*2, 5*time.Second)
			continue
		}
		errBackoff = 100 * time.Millisecond
		if batch != nil {
			l.c.metrics.claims.WithLabelValues(l.queue, source).Add(float64(len(batch.jobs)))
			source = sourceBusy
			l.handlers.Add(1)
			go func() {
				defer l.handlers.Done()
				defer func() { <-l.slots }()
				l.c.runBatch(hardCtx, batch, l)
			}()
			if waiter != waiterBusy && len(l.slots) == cap(l.slots) {
				// Saturated: every slot is busy, so producers need not wake
				// us (we claim again as soon as a slot frees). Below
				// saturation the idle mark stays: unmarking and re-marking
				// around every job would cost four statements per job, and
				// a mark that stayed up needs no barrier to sleep again.
				if l.c.setWaiter(ctx, l.queue, false) == nil {
					waiter = waiterBusy
				} else {
					waiter = waiterUnknown
				}
			}
			continue
		}
		<-l.slots
		nextAt = next
		if waiter == waiterBusy || waiter == waiterUnknown {
			// Going to sleep: say so first.
			if err := l.c.setWaiter(ctx, l.queue, true); err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Warn("could not mark the queue as waited on", zap.Error(err))
			} else {
				waiter = waiterMarked
			}
		}
		if waiter == waiterMarked {
			// Wait out producers that checked for waiters before the mark
			// committed, then look once more before sleeping for long.
			ok, err := l.c.idleBarrier(ctx, l.queue)
			if err != nil && ctx.Err() != nil {
				return
			}
			if ok {
				waiter = waiterIdle
				source = sourceBusy
				continue
			}
		}
		// Nothing due: wait.
		for {
			src, hint := l.takeWake()
			if !hint.IsZero() && (nextAt.IsZero() || hint.Before(nextAt)) {
				nextAt = hint
			}
			if src != "" {
				source = src
				if src == sourceResync {
					// The waiters table may have been emptied by a restart.
					waiter = waiterUnknown
				}
				break
			}
			wait, why := l.c.cfg.PollInterval, sourcePoll
			if waiter != waiterIdle && wait > markedRecheck {
				// Not known to be safe to sleep: producers may not notify.
				wait, why = markedRecheck, sourceRecheck
			}
			if !nextAt.IsZero() {
				if d := time.Until(nextAt); d < wait {
					wait, why = d, sourceScheduled
				}
			}
			if wait <= 0 {
				source = why
				break
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-l.signal:
				t.Stop()
				continue // look at what woke us
			case <-t.C:
				source = why
			}
			break
		}
		if source == sourceScheduled || source == sourcePoll || source == sourceRecheck {
			nextAt = time.Time{}
		}
	}
}

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

// setWaiter records whether this client's loop on queue is asleep.
func (c *Client) setWaiter(ctx context.Context, queue string, idle bool) error {
	_, err := c.pool.Exec(ctx, c.sql.setWaiter, queue, c.id, idle)
	if err != nil {
		return fmt.Errorf("set waiter: %w", err)
	}
	return nil
}

// wakeLockKey is the text whose hash keys a queue's advisory lock; it must
// match wake_needed() in migration 0004: '<quoted schema>.' || queue.
func (c *Client) wakeLockKey(queue string) string {
	return sqlident.Quote(c.cfg.Schema) + "." + queue
}

// idleBarrier tries, without queueing, the queue's advisory lock that every
// enqueue holds shared until it commits. Getting it means no producer that
// checked for waiters before our idle mark is still in flight.
func (c *Client) idleBarrier(ctx context.Context, queue string) (bool, error) {
	key := c.wakeLockKey(queue)
	delay := 200 * time.Microsecond
	for i := 0; ; i++ {
		var ok bool
		// Never queue for the lock: a waiting exclusive request would stall
		// every producer behind it.
		if err := c.pool.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, key).Scan(&ok); err != nil {
			return false, fmt.Errorf("idle barrier: %w", err)
		}
		if ok || i == 2 {
			return ok, nil
		}
		if !sleep(ctx, delay) {
			return false, ctx.Err()
		}
		delay *= 4
	}
}

// batch is claimed jobs with their open claim transaction, on a connection
// held from the pool until the transaction ends.
type batch struct {
	conn *pgxpool.Conn
	tx   pgx.Tx
	jobs []claimedJob
}

// release ends the transaction (rolling back if still open) and returns the
// connection to the pool, which discards it if it is not idle.
func (b *batch) release() {
	if b.conn == nil {
		return
	}
	if b.conn.Conn().PgConn().TxStatus() != 'I' {
		rollback(b.tx)
	}
	b.conn.Release()
	b.conn = nil
}

type claimedJob struct {
	job  Job
	wait time.Duration // from due to claim
}

// claimCursor is the index position of the last job a worker claimed.
type claimCursor struct {
	priority int16
	runAfter time.Time
	id       int64
}

// headEvery is how many claims in a row may start after the cursor before
// one starts at the head of the index again (to pick up jobs that sort
// before it: a more urgent priority, a job released by a crashed worker).
const headEvery = 16

// claim begins a transaction and locks up to n due jobs of queue, in one
// round trip; with a cursor, the scan starts after it (and falls back to the
// head if nothing is there). With no job due it returns nil and the time of
// the queue's earliest delayed job (zero if none).
func (c *Client) claim(ctx context.Context, queue string, n int, after *claimCursor) (*batch, time.Time, error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("acquire connection: %w", err)
	}
	b := &batch{conn: conn}
	scan := func(rows pgx.Rows) error {
		for rows.Next() {
			var cj claimedJob
			j := &cj.job
			var prio int16
			var attempts, maxAttempts int32
			var waitSec float64
			if err := rows.Scan(&j.ID, &j.Queue, &j.Kind, &j.Payload, &prio, &attempts, &maxAttempts,
				&j.RunAfter, &j.CreatedAt, &j.UniqueKey, &j.LastError, &waitSec); err != nil {
				return err
			}
			j.Priority, j.Attempt, j.MaxAttempts = int(prio), int(attempts)+1, int(maxAttempts)
			cj.wait = time.Duration(waitSec * float64(time.Second))
			b.jobs = append(b.jobs, cj)
		}
		return rows.Err()
	}
	pb := &pgx.Batch{}
	pb.BeginTx(pgx.TxOptions{})
	if c.claimIdleTimeout != "" {
		pb.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true)`, c.claimIdleTimeout)
	}
	if after != nil {
		pb.Queue(c.sql.claimAfter, queue, n, after.priority, after.runAfter, after.id).Query(scan)
	} else {
		pb.Queue(c.sql.claim, queue, n).Query(scan)
	}
	br := conn.Conn().SendBatch(ctx, pb)
	b.tx = br.Tx()
	if err := br.Close(); err != nil {
		b.release()
		return nil, time.Time{}, fmt.Errorf("claim: %w", err)
	}
	if len(b.jobs) == 0 && after != nil {
		// Nothing after the cursor: look from the head before concluding
		// that nothing is due.
		rows, err := b.tx.Query(ctx, c.sql.claim, queue, n)
		if err == nil {
			err = scan(rows)
			rows.Close()
		}
		if err != nil {
			b.release()
			return nil, time.Time{}, fmt.Errorf("claim: %w", err)
		}
	}
	if len(b.jobs) > 0 {
		return b, time.Time{}, nil
	}
	// Nothing due: end the transaction and ask for the earliest delayed job
	// in one more round trip.
	var ms *float64
	nb := &pgx.Batch{}
	nb.Queue(c.sql.next, queue).QueryRow(func(row pgx.Row) error { return row.Scan(&ms) })
	nb.Queue("ROLLBACK")
	err = conn.Conn().SendBatch(ctx, nb).Close()
	b.release()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("find next delayed job: %w", err)
	}
	if ms == nil {
		return nil, time.Time{}, nil
	}
	// Far-future jobs (up to year 9999 is allowed) overflow a Duration:
	// clamp, the poll interval bounds the sleep anyway.
	d := min(*ms, float64(maxHintDelay/time.Millisecond))
	return nil, time.Now().Add(time.Duration(d * float64(time.Millisecond))), nil
}

// idleMargin is how much longer than the longest job timeout a claim
// transaction may sit idle before the server ends it.
const idleMargin = 30 * time.Second

// claimIdleTimeoutFor decides what the claim transactions set as their
// idle_in_transaction_session_timeout. A handler working outside the
// database (an HTTP call, an exec handler's command) leaves its claim
// transaction idle; a server or role setting shorter than the job timeout
// would end the session under it and the job would run again, every time.
// So when the pool's setting is shorter than the longest job timeout plus
// idleMargin (or any kind has no timeout), each claim lifts it for its own
// transaction, one more statement in the claim's round trip; otherwise
// (the default, 0: no limit) nothing is sent. "" means nothing to set.
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
	err := c.pool.QueryRow(ctx, `SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'`).Scan(&ms)
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

func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// ErrTxOwned is returned when a handler tries to Commit or Rollback the claim
// transaction.
var ErrTxOwned = errors.New("queue: the claim transaction belongs to pgwake; return from the handler instead of committing or rolling back")

// PanicError is the error of an attempt whose handler panicked.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v\n%s", e.Value, e.Stack) }

// ErrTxAborted fails an attempt whose handler returned nil although a
// statement it ran in the claim transaction failed (leaving it aborted).
var ErrTxAborted = errors.New("handler returned nil but a statement it ran in the claim transaction failed; its writes were rolled back")

// ErrJobTimeout is wrapped by the error of an attempt that ran out of time.
var ErrJobTimeout = errors.New("job timed out")

// runBatch runs the jobs of one claim transaction one after another, each
// handler's writes behind its own savepoint, records failures in the same
// transaction, marks the rest succeeded and commits.
func (c *Client) runBatch(hardCtx context.Context, b *batch, l *queueLoop) {
	log := c.log.Named("worker")
	type done struct {
		j   *Job
		dur time.Duration
	}
	var succeeded []done
	var ids []int64
	type failed struct {
		j     *Job
		dur   time.Duration
		err   error
		state string
		in    time.Duration
	}
	var fails []failed
	broken := false
	for i := range b.jobs {
		cj := &b.jobs[i]
		j := &cj.job
		if hardCtx.Err() != nil {
			// Hard shutdown: everything in this transaction rolls back and
			// stays pending.
			broken = true
			break
		}
		c.metrics.wait.WithLabelValues(j.Queue).Observe(cj.wait.Seconds())
		jtx := &jobTx{tx: b.tx}
		start := time.Now()
		herr := c.runHandler(hardCtx, jtx, j)
		dur := time.Since(start)
		if herr == nil && b.conn.Conn().PgConn().TxStatus() == 'E' {
			// The handler swallowed a database error: its writes did not
			// happen, so the attempt failed.
			herr = ErrTxAborted
		}
		l.observe(dur)
		if herr == nil {
			succeeded = append(succeeded, done{j, dur})
			ids = append(ids, j.ID)
			continue
		}
		octx, cancel := context.WithTimeout(hardCtx, 30*time.Second)
		state, in, err := c.failInTx(octx, b.tx, jtx.savepoint, j, herr)
		cancel()
		if err != nil {
			// The transaction is unusable (a timeout broke the connection,
			// say): record this failure on its own; the rest of the batch
			// rolls back and will be claimed again.
			b.release()
			broken = true
			octx, cancel := context.WithTimeout(hardCtx, 30*time.Second)
			state, in, err = c.failFollowUp(octx, j, herr)
			cancel()
			if err != nil {
				log.Error("could not record a failed attempt; the job will run again", zap.Int64("job_id", j.ID),
					zap.String("queue", j.Queue), zap.String("kind", j.Kind), zap.Int("attempt", j.Attempt),
					zap.Error(err), zap.NamedError("job_error", herr))
				c.metrics.observe(j, outcomeCommitError, dur)
			} else {
				c.reportFailure(l, j, herr, dur, state, in)
			}
			break
		}
		fails = append(fails, failed{j, dur, herr, state, in})
	}
	if !broken {
		octx, cancel := context.WithTimeout(hardCtx, 30*time.Second)
		err := c.complete(octx, b, ids)
		cancel()
		if err == nil {
			for _, d := range succeeded {
				c.metrics.observe(d.j, outcomeSucceeded, d.dur)
				if ce := log.Check(zap.DebugLevel, "job succeeded"); ce != nil {
					ce.Write(zap.Int64("job_id", d.j.ID), zap.String("queue", d.j.Queue), zap.String("kind", d.j.Kind),
						zap.Int("attempt", d.j.Attempt), zap.Duration("duration", d.dur))
				}
			}
			for _, f := range fails {
				c.reportFailure(l, f.j, f.err, f.dur, f.state, f.in)
			}
			return
		}
		log.Warn("could not commit a claim transaction; its jobs will run again", zap.Error(err), zap.Int("jobs", len(b.jobs)))
		l.wake(sourceReleased, 0)
		for _, d := range succeeded {
			c.metrics.observe(d.j, outcomeCommitError, d.dur)
		}
		for _, f := range fails {
			c.metrics.observe(f.j, outcomeCommitError, f.dur)
		}
		return
	}
	b.release()
	for _, d := range succeeded {
		c.metrics.observe(d.j, outcomeCommitError, d.dur)
	}
	// Jobs of this batch went back to pending: look for them again.
	l.wake(sourceReleased, 0)
}

func (c *Client) reportFailure(l *queueLoop, j *Job, herr error, dur time.Duration, state string, retryIn time.Duration) {
	log := c.log.Named("worker")
	fields := []zap.Field{zap.Int64("job_id", j.ID), zap.String("queue", j.Queue), zap.String("kind", j.Kind),
		zap.Int("attempt", j.Attempt), zap.Error(herr), zap.Duration("duration", dur)}
	switch state {
	case StateFailed:
		c.metrics.observe(j, outcomeFailed, dur)
		log.Warn("job failed for good", fields...)
	case StatePending:
		c.metrics.observe(j, outcomeRetry, dur)
		log.Info("job attempt failed, retry scheduled", append(fields, zap.Duration("retry_in", retryIn))...)
		l.wake(sourceScheduled, max(retryIn, time.Millisecond))
	default:
		// Someone else recorded this attempt first (the job was claimed
		// again after our connection dropped); nothing to do.
		log.Info("failed attempt was already superseded", fields...)
	}
}

func (c *Client) runHandler(hardCtx context.Context, tx *jobTx, j *Job) (err error) {
	h, ok := c.cfg.Handlers[j.Kind]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownKind, j.Kind)
	}
	ctx := hardCtx
	var cancel context.CancelFunc = func() {}
	timeout := c.cfg.timeout(j.Kind)
	if timeout > 0 {
		ctx, cancel = context.WithTimeoutCause(hardCtx, timeout, fmt.Errorf("%w after %s", ErrJobTimeout, timeout))
	}
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: string(debug.Stack())}
		}
	}()
	err = h.Handle(ctx, tx, j)
	if err == nil && ctx.Err() != nil {
		// The handler ignored its deadline; its statements may not have run.
		err = context.Cause(ctx)
	}
	if err != nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrJobTimeout) && !errors.Is(err, ErrJobTimeout) {
		err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	return err
}

// complete marks jobs succeeded in the claim transaction and commits, in one
// round trip, then returns the connection to the pool.
func (c *Client) complete(ctx context.Context, b *batch, ids []int64) error {
	defer b.release()
	pb := &pgx.Batch{}
	if len(ids) > 0 {
		pb.Queue(c.sql.succeed, ids)
	}
	var tag pgconn.CommandTag
	pb.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	err := b.conn.Conn().SendBatch(ctx, pb).Close()
	if err != nil {
		return fmt.Errorf("mark succeeded and commit: %w", err)
	}
	// A COMMIT of an aborted transaction answers ROLLBACK without an error.
	if tag.String() != "COMMIT" {
		return fmt.Errorf("commit: the transaction was aborted (server answered %q)", tag.String())
	}
	return nil
}

func (c *Client) failArgs(j *Job, herr error) []any {
	msg := truncateError(herr.Error(), c.cfg.MaxErrorBytes)
	backoff := c.cfg.Backoff(j.Attempt)
	return []any{j.ID, int32(j.Attempt - 1), msg, backoff.Microseconds(), c.channel}
}

// failInTx rolls back the handler's writes (if it made any) and records the
// failed attempt in the claim transaction, which keeps the job locked.
func (c *Client) failInTx(ctx context.Context, tx pgx.Tx, savepoint bool, j *Job, herr error) (string, time.Duration, error) {
	if savepoint {
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+jobSavepoint); err != nil {
			return "", 0, err
		}
	}
	return c.execFail(ctx, tx, c.failArgs(j, herr))
}

// failFollowUp records a failed attempt in a transaction of its own, after
// the claim transaction was lost. The row lock waits for anyone who claimed
// the job meanwhile; the attempts check drops our record if they moved on.
func (c *Client) failFollowUp(ctx context.Context, j *Job, herr error) (string, time.Duration, error) {
	var state string
	var in time.Duration
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		state, in, err = c.execFail(ctx, tx, c.failArgs(j, herr))
		return err
	})
	return state, in, err
}

func (c *Client) execFail(ctx context.Context, tx pgx.Tx, args []any) (string, time.Duration, error) {
	var state string
	var ms float64
	var woke int64
	err := tx.QueryRow(ctx, c.sql.fail, args...).Scan(&state, &ms, &woke)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("record failure: %w", err)
	}
	return state, time.Duration(ms * float64(time.Millisecond)), nil
}

// truncateError cuts s to at most n bytes of valid UTF-8 without NUL bytes
// (PostgreSQL text cannot hold them), marking the cut.
func truncateError(s string, n int) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\\0"), "\uFFFD")
	if len(s) <= n {
		return s
	}
	const mark = " ...[truncated]"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
