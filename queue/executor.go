package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// The executor runs one claimed batch: record that its attempts started,
// run each handler behind its own savepoint, classify each outcome in Go
// (succeeded, failed: retry or fail for good by the retry policy), then
// record them all and commit in one round trip. Whatever ends the claim
// transaction early (a failed COMMIT, a lost connection, a handler that ends
// it) leaves the attempt records behind; see attempts.go.

// recordTimeout bounds the statements that record outcomes. They run on a
// context of their own, so a shutdown that cancels handlers still records
// what the handlers returned.
const recordTimeout = 30 * time.Second

// recordContext is the context outcomes are recorded on: it outlives a
// cancelled hardCtx by up to recordTimeout.
func (c *Client) recordContext(hardCtx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(hardCtx), cmp.Or(c.recordTimeout, recordTimeout))
}

// attemptResult is one attempt's outcome.
type attemptResult struct {
	job     *Job
	dur     time.Duration
	err     error         // nil: the handler succeeded
	state   JobState      // after a recorded failure: pending or failed; "" superseded
	retryIn time.Duration // after a recorded retry
	outcome string        // metrics outcome, when not implied by err and state
	// completed is the Complete hook's done function, once its write began.
	completed func(state JobState, err error)
}

// batchRun is what running a batch's handlers produced.
type batchRun struct {
	results []attemptResult // attempts whose outcome is in the claim transaction (or to be, for successes)
	broken  error           // not nil: the claim transaction is gone
	culprit *attemptResult  // the attempt that broke it, when known
	// wrote: a handler touched the claim transaction (took its savepoint),
	// so the commit waits for the WAL flush (complete).
	wrote bool
}

// execute runs batch b to the end and returns its connection to the pool.
// A handler that ends its goroutine (runtime.Goexit) skips the rest:
// the deferred settle rolls the batch back, and its attempts count as lost
// (attempts.go).
func (c *Client) execute(hardCtx context.Context, b *batch, l *queueLoop) {
	ended := false
	defer func() {
		if !ended {
			c.forgetStarts(b.stop())
			b.release()
			l.rewind.Store(true)
			l.wake(sourceReleased, 0)
		}
	}()
	c.executeBatch(hardCtx, b, l)
	ended = true
}

func (c *Client) executeBatch(hardCtx context.Context, b *batch, l *queueLoop) {
	defer c.untrack(b)
	rctx, cancel := c.recordContext(hardCtx)
	defer cancel()
	level, count := nextIsolation(b.lost, &b.jobs[0].job)
	if count {
		b.stop()
		c.countLost(rctx, b, l)
		return
	}
	if level == isolationAlone {
		c.exclusive.Lock() // waits for the client's other batches to end
		defer c.exclusive.Unlock()
	} else {
		c.exclusive.RLock()
		defer c.exclusive.RUnlock()
	}
	recorded, err := c.sendStarts(rctx, b, level)
	if err != nil {
		b.stop()
		b.release()
		l.rewind.Store(true)
		l.log.Warn("could not record that attempts started; the jobs stay pending", zap.Error(err), zap.Int("jobs", len(b.jobs)))
		l.wake(sourceReleased, 0)
		return
	}
	run := c.runJobs(hardCtx, b, l, recorded)
	unstarted := b.stop()
	if err := recorded(); err != nil {
		// The handlers ran unprotected: had the worker died, their attempts
		// would not count. Their outcomes are recorded as usual.
		l.log.Warn("could not record that attempts started", zap.Error(err), zap.Int("jobs", len(b.jobs)))
		// The record may have committed with its answer lost: look for it.
		time.AfterFunc(time.Second, func() { l.wake(sourceReleased, 0) })
	}
	// The completion's own budget, from now: the batch's handlers may
	// have run longer than recordTimeout, and a context made before them
	// failed the commit of every batch that did, its attempts uncounted
	// (TestHeldBatchLongerThanTheRecordTimeout).
	cancel()
	rctx, cancel = c.recordContext(hardCtx)
	if run.broken == nil {
		if len(unstarted) == 0 && b.freeSlot != nil && allSucceeded(run.results) {
			// Every claimed job ran and succeeded: the next claim starts
			// after them in claim order whether or not this commit has
			// landed (their rows are locked until it does), so it need not
			// wait for it. A cut batch or a failure keeps the slot until the
			// commit, so that what it releases is claimed again first.
			b.freeSlot()
		}
		for i := range run.results {
			c.completing(rctx, &run.results[i]) // failures' writes began already
		}
		err := c.complete(rctx, b, &run)
		if err == nil {
			for _, r := range run.results {
				r.completedWith(nil)
				c.report(l, r)
			}
			if len(unstarted) > 0 {
				l.rewind.Store(true)
				l.wake(sourceBusy, 0) // released by the commit: claim them again now
			}
			return
		}
		run.broken = fmt.Errorf("commit failed: %w", err)
		if staleStatement(err) {
			run.broken = fmt.Errorf("commit failed: %w (a handler dropped the connection's prepared statements: DEALLOCATE, perhaps inside a function)", err)
		}
	}
	for i := range run.results {
		run.results[i].completedWith(run.broken)
	}
	if run.culprit != nil {
		run.culprit.completedWith(run.broken)
	}
	b.release()
	l.rewind.Store(true)
	c.afterLostTx(rctx, l, run, unstarted)
}

// allSucceeded reports whether every attempt of rs succeeded.
func allSucceeded(rs []attemptResult) bool {
	for _, r := range rs {
		if r.err != nil {
			return false
		}
	}
	return true
}

// runJobs runs b's handlers one after another until the batch has run for
// cutAfter, the hard context ends, or the claim transaction breaks.
//
// A failure is recorded only after the attempt records are: the failure
// deletes its job's record, and a record committed after that delete would
// look like a lost attempt.
func (c *Client) runJobs(hardCtx context.Context, b *batch, l *queueLoop, recorded func() error) batchRun {
	var run batchRun
	hctx := context.WithValue(hardCtx, batchKey{}, b)
	start := time.Now()
	for i := range b.jobs {
		if i > 0 && (time.Since(start) >= c.cutAfter() || hardCtx.Err() != nil) {
			break
		}
		if !b.begin(i) {
			continue // cancelled before it started
		}
		cj := &b.jobs[i]
		j := &cj.job
		c.metrics.wait.WithLabelValues(j.Queue).Observe(cj.wait.Seconds())
		jtx := &jobTx{tx: b.tx, batch: b, idle: c.claimIdleTimeout}
		jctx, stop := context.WithCancelCause(hctx)
		c.signals.handlerStarting(j.ID)
		b.running(j.ID, stop)
		t0 := time.Now()
		cj.handed = *j // the handler's copy: what it changes is not our record
		herr := c.runHandler(jctx, jtx, &cj.handed)
		b.running(0, nil)
		if errors.Is(context.Cause(jctx), errCancelledWhileRunning) {
			herr = Cancel(errCancelledWhileRunning) // whatever it returned
		}
		stop(nil)
		run.wrote = run.wrote || jtx.savepoint
		r := attemptResult{job: j, dur: time.Since(t0), err: herr}
		l.observe(j.Kind, r.dur)
		if !c.settleHandler(hardCtx, b, jtx, &r, herr, &run, recorded) {
			return run
		}
	}
	return run
}

// settleHandler classifies a held handler's attempt r once it returned
// (herr) and records a failure in the claim transaction. It reports false
// when the transaction is gone (run.broken set): the batch stops there.
func (c *Client) settleHandler(hardCtx context.Context, b *batch, jtx *jobTx, r *attemptResult, herr error, run *batchRun, recorded func() error) bool {
	// What follows a handler has a record budget of its own, from now.
	rctx, rcancel := c.recordContext(hardCtx)
	defer rcancel()
	// For the batch's next handlers and its completion; a failed handler's
	// settings roll back with its savepoint.
	b.check(jtx.afterHandler(rctx, herr == nil))
	b.discard = b.discard || jtx.discard
	if b.conn.Conn().IsClosed() {
		// The connection died while this handler had it (it closed it,
		// ended its backend, or the session was killed): the attempt
		// failed, and the batch's transaction is gone. Found by the next
		// handler's statement instead, the neighbour was blamed
		// (TestNeighbourNotBlamedForABrokenConnection).
		r.err = withHandlerError(errConnectionLost, herr)
		run.broken, run.culprit = errConnectionLost, r
		return false
	}
	switch b.conn.Conn().PgConn().TxStatus() {
	case 'I':
		r.err = withHandlerError(ErrTxEnded, herr)
		run.broken, run.culprit = ErrTxEnded, r
		return false
	case 'E':
		if herr == nil {
			// The handler swallowed a database error: its writes did not
			// happen, so the attempt failed.
			r.err = ErrTxAborted
		}
	}
	if r.err != nil {
		// Its transaction's cancels of neighbours roll back with it.
		b.withdrawCancels(jtx.cancels)
		_ = recorded() // its error is reported once the handlers are done
		c.completing(rctx, r)
		if err := c.failInTx(rctx, b.tx, jtx.savepoint, r); err != nil {
			b.check(err)
			if connectionLost(err) {
				// The session died between handlers (a timeout a handler
				// set, an operator): who broke it is not known, so every
				// job runs again alone.
				run.results = append(run.results, *r)
				run.broken = err
				return false
			}
			run.broken, run.culprit = err, r
			return false
		}
	}
	run.results = append(run.results, *r)
	return true
}

// withHandlerError is err, the attempt's failure, naming the handler's own
// error when it returned one.
func withHandlerError(err, herr error) error {
	if herr == nil {
		return err
	}
	return fmt.Errorf("%w (handler error: %w)", err, herr)
}

// errConnectionLost fails the attempt of a handler whose claim connection
// died while it ran.
var errConnectionLost = errors.New("the claim transaction's connection was lost while the handler ran (closed, or its backend ended)")

// failInTx rolls back the handler's writes (if it made any) and records the
// failed attempt in the claim transaction, which keeps the job locked.
func (c *Client) failInTx(ctx context.Context, tx pgx.Tx, savepoint bool, r *attemptResult) error {
	if savepoint {
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+jobSavepoint); err != nil {
			return err
		}
	}
	rec, err := c.recordFailure(ctx, tx, r.job, r.err)
	r.recorded(rec)
	return err
}

// recorded sets what the failure record rec says about the attempt.
func (r *attemptResult) recorded(rec failRecord) {
	r.state, r.retryIn = rec.state, rec.retryIn
	switch rec.event {
	case EventSnoozed:
		r.outcome = outcomeSnoozed
	case EventCancelled:
		r.outcome = outcomeCancelled
	}
}

// probeByID makes the succeed statement plan without sequential scans, and
// keep its plan; succeed puts the two settings back as they were once its
// plan is chosen (planRestoredSQL, probeByIDRestore). The
// statement moves a batch by id (id = ANY($1)); once a connection has run
// it five times, PostgreSQL may keep a generic plan, costed for the table as
// it was then: a connection that warmed up on a small table (a quiet queue,
// a new one) then seq-scanned the whole table for every batch of a backlog,
// until autovacuum's next ANALYZE, 7.5-15 ms per batch of 32 in
// bench/peers/watermill's drain. Every plan of succeed is built under these
// settings, the generic one included, so it probes the primary keys at any
// table size (TestSucceedPlansForTheCurrentTable) and is kept: forcing a
// custom plan instead, as before issue 15's drain work, planned the
// statement for every batch, 0.17-0.2 ms each, more than half of completing
// a batch of one (and left to itself, PostgreSQL keeps planning batches of
// one: a custom plan for one id looks cheaper than the generic one).
//
// The settings must not outlive the statement: a plan that can only scan
// (a sequence, a table without a usable index, as in the commit-time
// trigger of the event feed) gets enable_seqscan's penalty in its cost,
// which then crosses jit_above_cost, and is cached that way by PL/pgSQL for
// every later transaction of the connection: 100 ms or more of JIT
// compilation per COMMIT. The previous values are kept in a
// transaction-local setting of our own meanwhile.
const (
	probeByID = `SELECT pg_catalog.set_config('enable_seqscan', 'off', true), pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true)
FROM (SELECT pg_catalog.set_config('pgwake.probe_saved', pg_catalog.current_setting('enable_seqscan') || ' ' || pg_catalog.current_setting('plan_cache_mode'), true)) s`
)

// complete records cancels and successes in the claim transaction, deletes
// the batch's attempt records and commits, in one round trip, then returns
// the connection to the pool. When every job succeeded, no handler touched
// the transaction and no cancel was asked, the commit holds nothing but
// the successes and does not wait for the WAL flush (asyncCommit): a
// database crash that forgets it leaves the jobs pending to run again, as
// a crash just before the commit would. A failure or a cancel, which a
// caller may wait for (Cancel), is flushed before it is reported.
func (c *Client) complete(ctx context.Context, b *batch, run *batchRun) error {
	defer b.release()
	succeeded := make([]int64, 0, len(run.results))
	for _, r := range run.results {
		if r.err == nil {
			succeeded = append(succeeded, r.job.ID)
		}
	}
	all := b.ids()
	pb := &pgx.Batch{}
	var skipped map[int64]bool // read only, so nil when nothing was cancelled
	cancels := b.cancelled()
	if len(cancels) > 0 {
		skipped = make(map[int64]bool, len(cancels))
		pb.Queue(c.sql.cancel, cancels).Query(func(rows pgx.Rows) error { return collectIDs(rows, skipped) })
	}
	marked := make(map[int64]bool, len(succeeded))
	pb.Queue(probeByID)
	// succeed puts the settings back itself (planRestoredSQL) before the
	// COMMIT.
	async := !run.wrote && len(cancels) == 0 && len(succeeded) == len(run.results)
	pb.Queue(c.sql.succeed, succeeded, all, async).Query(func(rows pgx.Rows) error { return collectIDs(rows, marked) })
	var tag pgconn.CommandTag
	pb.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	if err := b.conn.Conn().SendBatch(ctx, pb).Close(); err != nil {
		b.check(err)
		return err
	}
	// A COMMIT of an aborted transaction answers ROLLBACK without an error.
	if tag.String() != "COMMIT" {
		return fmt.Errorf("the transaction was aborted (server answered %q)", tag.String())
	}
	b.mu.Lock()
	b.skipped = skipped
	b.mu.Unlock()
	for i := range run.results {
		if r := &run.results[i]; r.err == nil && !marked[r.job.ID] {
			r.outcome = outcomeCancelled // its handler (or a neighbour's) cancelled it
		}
	}
	return nil
}

// collectIDs adds the first column of rows (an id) to into.
func collectIDs(rows pgx.Rows, into map[int64]bool) error {
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return err
		}
		into[id] = true
	}
	return rows.Err()
}

// afterLostTx handles a claim transaction that ended without recording its
// outcomes. The attempt that broke it, or the only attempt that ran, is
// recorded as failed in a transaction of its own. When several ran and none
// is known to be at fault, their attempt records stay behind and each job
// runs again alone (claimRecovered), so only the culprit's attempt counts.
func (c *Client) afterLostTx(ctx context.Context, l *queueLoop, run batchRun, unstarted []int64) {
	c.forgetStarts(unstarted)
	blame := run.culprit
	others := run.results
	if blame == nil && len(run.results) == 1 {
		r := run.results[0]
		if r.err == nil {
			r.err = run.broken
		} else {
			r.err = fmt.Errorf("%w (the attempt had failed: %w)", run.broken, r.err)
		}
		blame, others = &r, nil
	}
	for _, r := range others {
		r.outcome = outcomeCommitError
		c.report(l, r)
	}
	l.log.Warn("claim transaction lost; its jobs will run again, each alone, unless one is known to be at fault",
		zap.Error(run.broken), zap.Int("ran", len(run.results)), zap.Int("not_started", len(unstarted)))
	if blame != nil {
		c.failAlone(ctx, l, *blame)
	}
	l.wake(sourceReleased, 0)
	// The server may not have ended the lost transaction yet (its locks
	// hide the jobs from the recovery claim): look again in a second.
	time.AfterFunc(time.Second, func() { l.wake(sourceReleased, 0) })
}

// failAlone records a failed attempt in a transaction of its own, after its
// claim transaction was lost. The row lock waits for anyone who claimed the
// job meanwhile; the attempts check drops our record if they moved on.
func (c *Client) failAlone(ctx context.Context, l *queueLoop, r attemptResult) {
	c.completing(ctx, &r)
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		rec, err := c.recordFailure(ctx, tx, r.job, r.err)
		r.recorded(rec)
		return err
	})
	if err != nil {
		l.log.Error("could not record a failed attempt; it counts when the job is recovered", zap.Int64("job_id", r.job.ID),
			zap.String("kind", r.job.Kind), zap.Int("attempt", r.job.Attempt), zap.Error(err), zap.NamedError("job_error", r.err))
		r.outcome = outcomeCommitError
	}
	r.completedWith(err)
	c.report(l, r)
}

// report logs an attempt's outcome and counts it in the metrics.
func (c *Client) report(l *queueLoop, r attemptResult) {
	j := r.job
	if r.err == nil && r.outcome == "" {
		// A success: its fields are built only when debug logging is on.
		c.metrics.observe(j, outcomeSucceeded, r.dur)
		if ce := l.log.Check(zap.DebugLevel, "job succeeded"); ce != nil {
			ce.Write(c.reportFields(r)...)
		}
		return
	}
	fields := c.reportFields(r)
	switch {
	case r.outcome == outcomeSnoozed:
		c.metrics.observe(j, r.outcome, r.dur)
		l.log.Info("job snoozed", append(fields, zap.Duration("retry_in", r.retryIn))...)
		l.wake(sourceScheduled, max(r.retryIn, time.Millisecond))
	case r.outcome != "":
		c.metrics.observe(j, r.outcome, r.dur)
		l.log.Info("attempt ended: "+r.outcome, fields...)
	case r.state == StateFailed:
		c.metrics.observe(j, outcomeFailed, r.dur)
		l.log.Warn("job failed for good", fields...)
	case r.state == StatePending:
		c.metrics.observe(j, outcomeRetry, r.dur)
		l.log.Info("job attempt failed, retry scheduled", append(fields, zap.Duration("retry_in", r.retryIn))...)
		l.wake(sourceScheduled, max(r.retryIn, time.Millisecond))
	default:
		// Someone else recorded this attempt first (the job was recovered
		// after our connection dropped); nothing to do.
		l.log.Info("failed attempt was already superseded", fields...)
	}
}

// reportFields are the log fields of an attempt's outcome (l.log has the
// queue).
func (c *Client) reportFields(r attemptResult) []zap.Field {
	j := r.job
	fields := []zap.Field{zap.Int64("job_id", j.ID), zap.String("kind", j.Kind),
		zap.Int("attempt", j.Attempt), zap.Duration("duration", r.dur)}
	if r.err != nil {
		// As stored: handler errors can be megabytes (an exec handler's stderr).
		fields = append(fields, zap.String("error", truncateError(r.err.Error(), c.cfg.MaxErrorBytes)))
	}
	return fields
}

func (c *Client) runHandler(hardCtx context.Context, tx *jobTx, j *Job) (err error) {
	h, ok := c.cfg.Handlers[j.Kind]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownKind, j.Kind)
	}
	ctx := hardCtx
	var cancel context.CancelFunc = func() {}
	if t := c.timeouts[j.Kind]; t.d > 0 {
		ctx, cancel = context.WithTimeoutCause(hardCtx, t.d, t.cause)
	}
	defer cancel()
	var done func(error) // the Work hook's
	returned := false
	defer func() {
		tx.ended.Store(true) // ErrTxAfterHandler from now on
		r := recover()
		switch {
		case r != nil:
			err = &PanicError{Value: r, Stack: string(debug.Stack())}
		case !returned:
			// runtime.Goexit (t.FailNow in a test): the goroutine ends
			// whatever we do; execute's deferred release settles the
			// batch (TestHandlerGoexit).
			c.log.Error("handler ended its goroutine (runtime.Goexit, t.FailNow?); its batch rolls back and its attempt counts as lost",
				zap.Int64("job_id", j.ID), zap.String("kind", j.Kind))
		}
		err = callableError(err)
		// Rows, a QueryRow never scanned or batch results the handler
		// left open would keep the connection busy for the completion.
		if tx.closeLeft() && err == nil {
			c.log.Warn("handler left rows or batch results open; pgwake closed them (close them before returning)",
				zap.Int64("job_id", j.ID), zap.String("kind", j.Kind))
		}
		if done != nil {
			c.callDone(j, done, err)
		}
	}()
	if hook := c.cfg.Hooks.Work; hook != nil {
		ctx, done = hook(ctx, j) // a panic here fails the attempt like the handler's
	}
	err = h.Handle(ctx, tx, j)
	returned = true
	if err == nil && ctx.Err() != nil {
		// The handler ignored its deadline; its statements may not have run.
		err = context.Cause(ctx)
	}
	if err != nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrJobTimeout) && !errors.Is(err, ErrJobTimeout) {
		err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	return err
}

// callableError is err, or a PanicError when err's Error method panics: a
// handler that returns a nil pointer of an error type whose Error reads its
// fields (the typed-nil mistake) would otherwise crash the worker when its
// failure is recorded (TestHandlerErrorsThatPanic).
func callableError(err error) (out error) {
	if err == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			out = &PanicError{Value: fmt.Sprintf("the handler returned a %T whose Error method panics (a nil pointer?): %v", err, r),
				Stack: string(debug.Stack())}
		}
	}()
	_ = err.Error()
	return err
}

// callDone calls the Work hook's done function; a panic in it is logged,
// not let loose on the worker.
func (c *Client) callDone(j *Job, done func(error), err error) {
	defer c.recoverHook("the Work hook's done function", j.ID)
	done(err)
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
