package queue

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

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

	c.log.Info("workers starting", zap.Int("queues", len(c.loops)))
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
	if n > int64(100*365*24*time.Hour/time.Millisecond) {
		n = int64(100 * 365 * 24 * time.Hour / time.Millisecond)
	}
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
		if l.now == "" {
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

// dispatch is the loop: take a free slot, claim a job, hand it to a handler
// goroutine; when nothing is due, sleep until a wake-up, the earliest known
// delayed job, or the poll interval.
func (l *queueLoop) dispatch(ctx, hardCtx context.Context) {
	log := l.c.log.Named("worker").With(zap.String("queue", l.queue))
	source := sourceStart
	var nextAt time.Time // earliest future run_after known
	errBackoff := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case l.slots <- struct{}{}:
		}
		cl, next, err := l.c.claim(ctx, l.queue)
		if err != nil {
			<-l.slots
			if ctx.Err() != nil {
				return
			}
			log.Warn("claim failed", zap.Error(err), zap.Duration("backoff", errBackoff))
			l.c.metrics.claimErrors.WithLabelValues(l.queue).Inc()
			if !sleep(ctx, errBackoff) {
				return
			}
			errBackoff = min(errBackoff*2, 5*time.Second)
			continue
		}
		errBackoff = 100 * time.Millisecond
		if cl != nil {
			l.c.metrics.claims.WithLabelValues(l.queue, source).Inc()
			source = sourceBusy
			l.handlers.Add(1)
			go func() {
				defer l.handlers.Done()
				defer func() { <-l.slots }()
				l.c.work(hardCtx, cl, l)
			}()
			continue
		}
		<-l.slots
		nextAt = next
		// Nothing due: wait.
		for {
			src, hint := l.takeWake()
			if !hint.IsZero() && (nextAt.IsZero() || hint.Before(nextAt)) {
				nextAt = hint
			}
			if src != "" {
				source = src
				break
			}
			wait, why := l.c.cfg.PollInterval, sourcePoll
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
		if source == sourceScheduled || source == sourcePoll {
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

// claimed is a job with its open claim transaction.
type claimed struct {
	job  Job
	tx   pgx.Tx
	wait time.Duration // from due to claim
}

const handlerSavepoint = "pgwake_handler"

// claim begins a transaction and locks the next due job of queue. With no job
// due it returns nil and the time of the queue's earliest delayed job (zero
// if none).
func (c *Client) claim(ctx context.Context, queue string) (*claimed, time.Time, error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("begin claim: %w", err)
	}
	// Claim and take the savepoint that handler failures roll back to, in
	// one round trip.
	b := &pgx.Batch{}
	var cl claimed
	var found bool
	var waitSec float64
	b.Queue(c.sql.claim, queue).QueryRow(func(row pgx.Row) error {
		j := &cl.job
		var prio int16
		var attempts, maxAttempts int32
		err := row.Scan(&j.ID, &j.Queue, &j.Kind, &j.Payload, &prio, &attempts, &maxAttempts,
			&j.RunAfter, &j.CreatedAt, &j.UniqueKey, &j.LastError, &waitSec)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		j.Priority, j.Attempt, j.MaxAttempts = int(prio), int(attempts)+1, int(maxAttempts)
		return nil
	})
	b.Queue("SAVEPOINT " + handlerSavepoint)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		rollback(tx)
		return nil, time.Time{}, fmt.Errorf("claim: %w", err)
	}
	if found {
		cl.tx = tx
		cl.wait = time.Duration(waitSec * float64(time.Second))
		return &cl, time.Time{}, nil
	}
	var ms *float64
	err = tx.QueryRow(ctx, c.sql.next, queue).Scan(&ms)
	rollback(tx)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("find next delayed job: %w", err)
	}
	if ms == nil {
		return nil, time.Time{}, nil
	}
	return nil, time.Now().Add(time.Duration(*ms * float64(time.Millisecond))), nil
}

func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// ErrTxOwned is returned when a handler tries to Commit or Rollback the claim
// transaction.
var ErrTxOwned = errors.New("queue: the claim transaction belongs to pgwake; return from the handler instead of committing or rolling back")

// handlerTx is the claim transaction as a handler sees it: everything but
// Commit and Rollback.
type handlerTx struct{ pgx.Tx }

func (handlerTx) Commit(context.Context) error   { return ErrTxOwned }
func (handlerTx) Rollback(context.Context) error { return ErrTxOwned }

// PanicError is the error of an attempt whose handler panicked.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v\n%s", e.Value, e.Stack) }

// ErrJobTimeout is wrapped by the error of an attempt that ran out of time.
var ErrJobTimeout = errors.New("job timed out")

// work runs one claimed job to the end of its attempt and records the outcome.
func (c *Client) work(hardCtx context.Context, cl *claimed, l *queueLoop) {
	j := &cl.job
	log := c.log.Named("worker").With(zap.Int64("job_id", j.ID), zap.String("queue", j.Queue),
		zap.String("kind", j.Kind), zap.Int("attempt", j.Attempt))
	c.metrics.wait.WithLabelValues(j.Queue).Observe(cl.wait.Seconds())

	start := time.Now()
	herr := c.runHandler(hardCtx, cl)
	dur := time.Since(start)

	// Our own statements get a fresh deadline, but stop on hard shutdown.
	octx, cancel := context.WithTimeout(hardCtx, 30*time.Second)
	defer cancel()

	if herr == nil {
		err := c.complete(octx, cl)
		if err == nil {
			c.metrics.observe(j, outcomeSucceeded, dur)
			log.Debug("job succeeded", zap.Duration("duration", dur))
			return
		}
		// The job stays pending and will run again: at-least-once.
		log.Warn("could not commit a successful job; it will run again", zap.Error(err), zap.Duration("duration", dur))
		c.metrics.observe(j, outcomeCommitError, dur)
		return
	}
	state, retryIn, err := c.recordFailure(octx, cl, herr)
	if err != nil {
		log.Error("could not record a failed attempt; the job will run again", zap.Error(err), zap.NamedError("job_error", herr))
		c.metrics.observe(j, outcomeCommitError, dur)
		return
	}
	switch state {
	case StateFailed:
		c.metrics.observe(j, outcomeFailed, dur)
		log.Warn("job failed for good", zap.Error(herr), zap.Duration("duration", dur))
	case StatePending:
		c.metrics.observe(j, outcomeRetry, dur)
		log.Info("job attempt failed, retry scheduled", zap.Error(herr), zap.Duration("duration", dur), zap.Duration("retry_in", retryIn))
		l.wake(sourceScheduled, max(retryIn, time.Millisecond))
	default:
		// Someone else recorded this attempt first (the job was claimed again
		// after our connection dropped); nothing to do.
		log.Info("failed attempt was already superseded", zap.Error(herr))
	}
}

func (c *Client) runHandler(hardCtx context.Context, cl *claimed) (err error) {
	j := &cl.job
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
	err = h.Handle(ctx, handlerTx{cl.tx}, j)
	if err == nil && ctx.Err() != nil {
		// The handler ignored its deadline; its statements may not have run.
		err = context.Cause(ctx)
	}
	if err != nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrJobTimeout) && !errors.Is(err, ErrJobTimeout) {
		err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	return err
}

// complete marks the job succeeded in the claim transaction and commits.
func (c *Client) complete(ctx context.Context, cl *claimed) error {
	if _, err := cl.tx.Exec(ctx, c.sql.succeed, cl.job.ID); err != nil {
		rollback(cl.tx)
		return fmt.Errorf("mark succeeded: %w", err)
	}
	if err := cl.tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// recordFailure rolls back the handler's writes and records the failed
// attempt: in the claim transaction when its connection is healthy (the job
// stays locked throughout), else in a follow-up transaction. It returns the
// job's new state ("" if the attempt was recorded by someone else) and the
// delay until the retry.
func (c *Client) recordFailure(ctx context.Context, cl *claimed, herr error) (string, time.Duration, error) {
	msg := truncateError(herr.Error(), c.cfg.MaxErrorBytes)
	backoff := c.cfg.Backoff(cl.job.Attempt)
	prevAttempts := int32(cl.job.Attempt - 1)
	args := []any{cl.job.ID, prevAttempts, msg, backoff.Microseconds(), c.channel}

	if _, err := cl.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+handlerSavepoint); err == nil {
		state, in, err := c.execFail(ctx, cl.tx, args)
		if err == nil {
			if err = cl.tx.Commit(ctx); err == nil {
				return state, in, nil
			}
		} else {
			rollback(cl.tx)
		}
		if ctx.Err() != nil {
			return "", 0, err
		}
	} else {
		rollback(cl.tx)
	}
	// Follow-up transaction. The lock waits for anyone who claimed the job
	// meanwhile; the attempts check drops our record if they moved it on.
	var state string
	var in time.Duration
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		state, in, err = c.execFail(ctx, tx, args)
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
