package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/backoff"
)

// Leased mode (Config.LeasedKinds). The claim commits at once: the jobs are
// running, their attempts counted, each with a lease owned by this client.
// Each handler then runs on its own goroutine and slot, holding no
// connection; its tx begins a transaction on first use. Completion is a
// short transaction (the handler's, when it used one) that only moves the
// job while this client still holds its lease. One statement per
// LeaseDuration/3 extends every lease the client holds; a lease that is not
// extended expires and is rescued (counted as a failed attempt, retried with
// backoff) by any client working the queue.

// ErrLeaseLost is the cause of a leased handler's context when the job is no
// longer its worker's: its lease expired and it was rescued, or it was
// cancelled.
var ErrLeaseLost = errors.New("queue: the job is no longer this worker's: its lease expired and it was rescued, or it was cancelled")

// errLeaseExpired is recorded for a rescued job.
var errLeaseExpired = errors.New("lease expired: the worker stopped extending it (process died, stalled or lost the database)")

// leasedRun is a leased job running in this client.
type leasedRun struct {
	attempt int
	cancel  context.CancelCauseFunc
	// superseded: this client claimed the job again while this run's
	// handler ran (its claim, committed without waiting for the WAL flush,
	// was lost in a database crash): the run is cancelled and writes no
	// outcome, which the new run's claim would accept as its own.
	superseded atomic.Bool
}

// errSuperseded is the cause a superseded run's handler is cancelled with.
var errSuperseded = fmt.Errorf("%w: the job was claimed again while its handler ran (its claim was lost, as in a database crash)", ErrLeaseLost)

// cancelPrefix starts the payload that tells a job's worker it was
// cancelled: '!' starts no queue name.
const cancelPrefix = "!cancel|"

// stopPrefix starts the payload that Cancel sends before it waits for a
// held-mode job's row: the worker running the job cancels its handler and
// records the attempt cancelled.
const stopPrefix = "!stop|"

// onCancelNotify cancels the handler of a running job of ours: a leased job
// that was cancelled ("!cancel|<id>"), or a held-mode job that Cancel is
// waiting for ("!stop|<id>").
func (c *Client) onCancelNotify(payload string) {
	if rest, ok := strings.CutPrefix(payload, stopPrefix); ok {
		if id, err := strconv.ParseInt(rest, 10, 64); err == nil {
			if b := c.claimedBatch(id); b != nil {
				go c.stopIfConfirmed(b, id)
			}
		}
		return
	}
	id, err := strconv.ParseInt(strings.TrimPrefix(payload, cancelPrefix), 10, 64)
	if err != nil {
		return
	}
	// NOTIFY needs no privilege: any role that can connect could send
	// this. A real cancel committed before its notification was sent, so
	// the row says so; a job still running under our lease was not
	// cancelled (TestSpoofedControlsAreIgnored). Off the listener's
	// goroutine: one read.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var ours bool
		err := c.pool.QueryRow(ctx, c.sql.leaseHeld, id, c.id).Scan(&ours)
		if err == nil && ours {
			c.log.Warn("ignored a cancel notification for a job still running under this worker's lease (not sent by a cancel)", zap.Int64("job_id", id))
			return
		}
		c.applyCancel(id)
	}()
}

// stopWait bounds how long a stop notification waits for the Cancel that
// sent it to queue for the job's row (it sends before its UPDATE).
const stopWait = 3 * time.Second

// stopIfConfirmed stops held job id of b once a session waits for a lock
// on a jobs row that b's claim transaction holds: Cancel's UPDATE, queued
// behind the claim, right after its notification. NOTIFY needs no
// privilege, but locking a job row needs a role that may change jobs (or a
// cancel function it may call): a notification nobody follows with that
// wait is ignored (TestSpoofedControlsAreIgnored).
func (c *Client) stopIfConfirmed(b *batch, id int64) {
	if b.pid == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopWait)
	defer cancel()
	for {
		var waited bool
		err := c.pool.QueryRow(ctx, c.sql.rowWaiter, b.pid).Scan(&waited)
		if err == nil && waited {
			b.stopJob(id)
			return
		}
		select {
		case <-ctx.Done():
			c.log.Warn("ignored a stop notification no cancel followed (not sent by Cancel?)", zap.Int64("job_id", id))
			return
		case <-b.done:
			return // the attempt ended meanwhile; Cancel goes on by itself
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// applyCancel cancels the handler of leased job id if it runs here, or
// keeps the cancel for a run about to register (earlyCancelsKept).
func (c *Client) applyCancel(id int64) {
	c.early.mu.Lock()
	defer c.early.mu.Unlock()
	if v, ok := c.leases.Load(id); ok {
		v.(*leasedRun).cancel(ErrLeaseLost)
		return
	}
	c.early.add(id, time.Now())
	if ts := c.signals; ts != nil {
		ts.cancelKept.signal(id)
	}
}

// earlyCancelsKept is how long a cancel of a leased job that does not run
// here is kept, and earlyCancelsMax how many at most: a job claimed by this
// client whose cancel was committed and notified between the claim's commit
// and the handler's registration (less than a round trip) is cancelled at
// registration instead of at the next heartbeat.
const (
	earlyCancelsKept = 5 * time.Second
	earlyCancelsMax  = 4096
)

// earlyCancels are recent cancels of leased jobs not running in this
// client, most of them running elsewhere. mu also orders them against the
// registration of leases (register), so a cancel is either found there or
// finds the lease.
type earlyCancels struct {
	mu  sync.Mutex
	ids map[int64]time.Time
}

// add keeps id, dropping expired entries (and, past earlyCancelsMax, all
// of them: a cancel missed here is caught at the next heartbeat).
func (e *earlyCancels) add(id int64, now time.Time) {
	if e.ids == nil {
		e.ids = map[int64]time.Time{}
	}
	if len(e.ids) >= earlyCancelsMax/2 {
		for k, at := range e.ids {
			if now.Sub(at) > earlyCancelsKept {
				delete(e.ids, k)
			}
		}
		if len(e.ids) >= earlyCancelsMax {
			clear(e.ids)
		}
	}
	e.ids[id] = now
}

// register stores run as the lease of job id and cancels it at once if
// its cancel arrived first.
func (c *Client) register(id int64, run *leasedRun) {
	c.early.mu.Lock()
	defer c.early.mu.Unlock()
	if old, ok := c.leases.Swap(id, run); ok && old.(*leasedRun) != run {
		// The same client claimed the job again while a run of it was
		// registered (TestLostLeasedClaimCancelsTheFirstRun).
		old.(*leasedRun).superseded.Store(true)
		old.(*leasedRun).cancel(errSuperseded)
	}
	if at, ok := c.early.ids[id]; ok {
		delete(c.early.ids, id)
		if time.Since(at) <= earlyCancelsKept {
			run.cancel(ErrLeaseLost)
		}
	}
}

// executeLeased starts a claimed leased batch (unless its claim started it:
// one round trip, mark running and commit) and runs each job on its own
// goroutine and slot.
func (c *Client) executeLeased(hardCtx context.Context, b *batch, l *queueLoop) {
	started := c.startLeased(hardCtx, b, l)
	if len(started) == 0 {
		b.signalStarted() // no handler will start: the dispatcher need not wait
	}
	for i := range b.jobs {
		cj := &b.jobs[i]
		if !started[cj.job.ID] {
			<-l.slots // not started (cancelled meanwhile, or the start failed)
			continue
		}
		// Known before the handler starts: a cancel that arrives from now
		// on reaches it.
		ctx, cancel := context.WithCancelCause(hardCtx)
		if ts := c.signals; ts != nil && ts.beforeLease != nil {
			ts.beforeLease(cj.job.ID)
		}
		run := &leasedRun{attempt: cj.job.Attempt, cancel: cancel}
		c.register(cj.job.ID, run)
		l.handlers.Add(1)
		go func() {
			defer l.handlers.Done()
			defer cancel(nil)
			// Only this run's entry: a handler that outlived its lease may
			// return after the job's next run (rescued, claimed again by
			// this client) registered its own (TestStaleHandlerKeepsTheNewRunsLease).
			defer c.leases.CompareAndDelete(cj.job.ID, run)
			var once sync.Once
			release := func() { once.Do(l.freeSlot) }
			defer release()
			c.signals.handlerStarting(cj.job.ID)
			b.signalStarted() // the handler starts now (handOff)
			c.runLeased(hardCtx, ctx, l, cj, run, release)
		}()
	}
}

// startLeased marks the jobs of b running and commits, unless its claim
// did (b.started), and returns the ids started.
func (c *Client) startLeased(hardCtx context.Context, b *batch, l *queueLoop) map[int64]bool {
	started := make(map[int64]bool, len(b.jobs))
	if b.started {
		for _, cj := range b.jobs {
			started[cj.job.ID] = true
		}
		return started
	}
	ids := b.ids()
	rctx, cancel := c.recordContext(hardCtx)
	pb := &pgx.Batch{}
	pb.Queue(c.sql.startLeased, ids, float64(c.cfg.LeaseDuration.Microseconds()), c.id).Query(func(rows pgx.Rows) error {
		return collectIDs(rows, started)
	})
	pb.Queue("COMMIT")
	err := b.conn.Conn().SendBatch(rctx, pb).Close()
	cancel()
	b.stop()
	b.release()
	c.untrack(b)
	if err != nil {
		l.log.Warn("could not start leased jobs; they stay pending", zap.Error(err), zap.Int("jobs", len(b.jobs)))
		l.wake(sourceReleased, 0)
		return nil
	}
	return started
}

// completionBacklog is how many grouped completions of a loop's jobs may
// wait for their write with their slots freed (at least as many as the loop
// has slots): beyond it, a finished job holds its slot until its
// completion is written, so a slow database slows the claims.
const completionBacklog = 1000

// freeSlot frees a leased job's slot and tells a dispatcher waiting in
// awaitFreeSlots.
func (l *queueLoop) freeSlot() {
	<-l.slots
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// runLeased runs one started leased job (ctx: its handler's context) and
// records its outcome. It calls release to free the job's slot as soon as
// the handler returned when the outcome is a success for the grouped
// completion (no handler transaction), while fewer than completionBacklog
// completions wait for theirs: the next job need not wait for this one's
// commit.
func (c *Client) runLeased(hardCtx, ctx context.Context, l *queueLoop, cj *claimedJob, run *leasedRun, release func()) {
	j := &cj.job
	c.metrics.wait.WithLabelValues(j.Queue).Observe(cj.wait.Seconds())
	// The handler's transaction, begun on its first statement on a
	// connection of its own, which jtx gives back.
	jtx := &jobTx{pool: c.pool}
	defer jtx.giveBack()
	t0 := time.Now()
	cj.handed = *j // the handler's copy: what it changes is not our record
	herr := c.runHandler(ctx, jtx, &cj.handed)
	r := attemptResult{job: j, dur: time.Since(t0), err: herr}
	c.kinds.observe(j.Kind, r.dur)
	if herr != nil && errors.Is(context.Cause(ctx), ErrLeaseLost) {
		r.err = fmt.Errorf("%w: %w", ErrLeaseLost, herr)
	}
	rctx, rcancel := c.recordContext(hardCtx)
	defer rcancel()
	rctx = context.WithValue(rctx, retryStopKey{}, hardCtx.Done()) // retryLeaseWrite stops at the hard stop
	if jtx.tx != nil {
		switch jtx.tx.Conn().PgConn().TxStatus() {
		case 'E':
			if r.err == nil {
				r.err = ErrTxAborted
			}
		case 'I':
			// The handler ended its transaction (COMMIT or ROLLBACK as
			// SQL), as held mode finds it (TestLeasedHandlerEndingItsTransaction).
			r.err = withHandlerError(ErrTxEnded, herr)
		}
	}
	// Before the completion runs in this transaction.
	if err := jtx.afterHandler(rctx, herr == nil); err != nil && r.err == nil {
		r.err = err
	}
	c.completing(rctx, &r)
	var werr error
	switch {
	case run.superseded.Load():
		// The job's new run owns its outcome: write nothing.
		if jtx.tx != nil {
			rollback(jtx.tx)
		}
		r.err, r.outcome, werr = errSuperseded, outcomeLeaseLost, errSuperseded
	case r.err == nil:
		if jtx.tx == nil && l.completing.Add(1) <= int64(max(cap(l.slots), completionBacklog)) {
			release()
		}
		werr = c.completeLeased(rctx, l, jtx, &r)
		if jtx.tx == nil {
			l.completing.Add(-1)
		}
		if werr != nil && r.outcome == outcomeCommitError && jtx.tx != nil && !retryableWrite(werr) {
			// The handler's COMMIT failed (a deferred constraint): the
			// attempt failed, recorded now with the cause, not left to
			// its lease's expiry (TestLeasedCommitFailureIsRecorded).
			r.err, r.outcome = fmt.Errorf("commit failed: %w", werr), ""
			jtx.giveBack()
			werr = c.failLeased(rctx, l, &r, c.id)
		}
	default:
		if jtx.tx != nil {
			rollback(jtx.tx)
		}
		// Its connection back first: failLeased takes one from the pool,
		// which failing handlers holding theirs had emptied
		// (TestLeasedFailuresDoNotHoldThePool).
		jtx.giveBack()
		werr = c.failLeased(rctx, l, &r, c.id)
	}
	jtx.giveBack() // before the report and its hooks
	r.completedWith(werr)
	c.report(l, r)
}

// completeLeased marks a leased job succeeded, in the handler's transaction
// when it used one (its writes commit with the completion), if this client
// still holds the lease; otherwise the handler's writes roll back. It
// returns the write's error, or ErrLeaseLost.
func (c *Client) completeLeased(ctx context.Context, l *queueLoop, jtx *jobTx, r *attemptResult) error {
	j := r.job
	var ok bool
	var err error
	if jtx.tx == nil {
		ok, err = c.completions.complete(ctx, c, j.ID, int32(j.Attempt))
	} else {
		// On its generic plan, as the grouped completion (flush); the
		// statement puts the handler's setting back before the commit.
		marked := map[int64]bool{}
		pb := c.succeedBatch([]int64{j.ID}, []int32{int32(j.Attempt)}, marked)
		err = jtx.tx.SendBatch(ctx, pb).Close()
		ok = marked[j.ID]
		switch {
		case err == nil && ok:
			err = jtx.tx.Commit(ctx)
		case err == nil && jtx.cancelledThrough(j.ID):
			// The handler cancelled its own job (CancelTx): that commits,
			// as in held mode; rolled back, the job stayed running until
			// its lease expired and was retried
			// (TestLeasedCancelTxOfItsOwnJob).
			if err = jtx.tx.Commit(ctx); err == nil {
				r.outcome = outcomeCancelled
				return nil
			}
		default:
			rollback(jtx.tx)
		}
	}
	switch {
	case err != nil:
		l.log.Warn("could not record a leased job's success; its lease will expire and it will be retried",
			zap.Int64("job_id", j.ID), zap.Error(err))
		r.outcome = outcomeCommitError
		return err
	case !ok:
		r.outcome = outcomeLeaseLost
		return ErrLeaseLost
	}
	return nil
}

// completer records the successes of leased jobs whose handlers did not use
// their transaction, many in one statement: the first completion to arrive
// waits completionLinger (or until completionGroupFull are waiting), then
// writes every completion queued by then, and goes on while more arrived
// during its statement (group commit). Thousands of concurrent jobs then
// cost a few commits a second, not one each, and so do jobs that arrive one
// at a time at a few hundred a second.
// completionLinger is how long the first success to arrive waits for
// others before the completer writes them together (River's completer
// writes every 50-250 ms). At 200 jobs a second, writing each success on
// its own cost about a fifth of the database's CPU time in the latency
// bench (docs/benchmarks.md). The job's slot is free meanwhile; only its
// state, its succeeded event and its Complete hook wait.
const completionLinger = 20 * time.Millisecond

// completionGroupFull is how many waiting successes end the wait at once:
// a statement of that many costs a hundredth of a statement per job
// already, and the successes of a large leased claim, which arrive within
// a few ms of each other, need not wait out the linger.
const completionGroupFull = 100

type completer struct {
	mu       sync.Mutex
	pending  []*completion
	flushing bool
	// full is closed when completionGroupFull successes are pending while
	// the first waits (nil otherwise).
	full chan struct{}
	// linger is completionLinger unless a test set it (0: the default).
	linger time.Duration
}

type completion struct {
	id      int64
	attempt int32
	ok      bool
	err     error
	done    chan struct{}
}

// complete records job id's attempt succeeded if this client still holds
// its lease; ok is false when it does not.
func (cp *completer) complete(ctx context.Context, c *Client, id int64, attempt int32) (ok bool, err error) {
	me := &completion{id: id, attempt: attempt, done: make(chan struct{})}
	cp.mu.Lock()
	cp.pending = append(cp.pending, me)
	if cp.flushing {
		if cp.full != nil && len(cp.pending) >= completionGroupFull {
			close(cp.full)
			cp.full = nil
		}
		cp.mu.Unlock()
		<-me.done
		return me.ok, me.err
	}
	cp.flushing = true
	// Gather the successes of the next completionLinger before writing.
	full := make(chan struct{})
	cp.full = full
	cp.mu.Unlock()
	t := time.NewTimer(cmp.Or(cp.linger, completionLinger))
	select {
	case <-t.C:
	case <-full:
		t.Stop()
	}
	cp.mu.Lock()
	cp.full = nil
	for len(cp.pending) > 0 {
		batch := cp.pending
		cp.pending = nil
		cp.mu.Unlock()
		cp.flush(ctx, c, batch)
		cp.mu.Lock()
	}
	cp.flushing = false
	cp.mu.Unlock()
	return me.ok, me.err
}

// succeedBatch is the leased completion of ids (attempts) on its generic
// plan (genericPlan, see flush), marking in marked the ids it moved.
func (c *Client) succeedBatch(ids []int64, attempts []int32, marked map[int64]bool) *pgx.Batch {
	pb := &pgx.Batch{}
	pb.Queue(genericPlan)
	pb.Queue(c.sql.succeedLeased, ids, attempts, c.id).Query(func(rows pgx.Rows) error { return collectIDs(rows, marked) })
	return pb
}

// flush writes batch in one statement and hands each its result. The
// statement runs with its generic plan (genericPlan, in the same implicit
// transaction): the custom plans PostgreSQL makes for its first executions on
// a connection, with the ids' count known and statistics gathered while no
// job ran, scanned the whole table once per job (a join filter of 5,000 x
// 226 rows, 230-440 ms, where the generic plan probes the primary key: 2,500
// jobs in 15 ms; auto_explain, issue 11).
func (cp *completer) flush(ctx context.Context, c *Client, batch []*completion) {
	ids := make([]int64, len(batch))
	attempts := make([]int32, len(batch))
	for i, cm := range batch {
		ids[i], attempts[i] = cm.id, cm.attempt
	}
	marked := map[int64]bool{}
	err := c.retryLeaseWrite(ctx, func() error {
		return c.pool.SendBatch(ctx, c.succeedBatch(ids, attempts, marked)).Close()
	})
	for _, cm := range batch {
		cm.ok, cm.err = marked[cm.id], err
		close(cm.done)
	}
}

// retryLeaseWrite runs write, a leased job's outcome through the pool, and
// runs it again while it fails on a lost or refused connection (a
// restarted database, a terminated idle connection of the pool), for up to
// LeaseDuration: the lease is kept meanwhile by the heartbeat, or has run
// out, and the write, guarded by the lease (leased_by, attempts, state),
// then moves nothing. Without it the outcome of a handler that returned
// during a short outage was lost and the job, once its lease expired, ran
// again with the attempt counted as failed
// (TestLeasedOutcomeWrittenAfterALostConnection). A retry after a write
// that did commit before its connection broke finds the job no longer
// running: reported as a lost lease, the job's state is right.
// A shutdown past its deadline (the client's hard stop, which ctx carries
// as retryStopKey) ends the retries, not the first write.
func (c *Client) retryLeaseWrite(ctx context.Context, write func() error) error {
	err := write()
	deadline := time.Now().Add(c.cfg.LeaseDuration)
	stop, _ := ctx.Value(retryStopKey{}).(<-chan struct{})
	bo := backoff.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for wait := bo.Next(); err != nil && retryableWrite(err) && time.Now().Add(wait).Before(deadline); wait = bo.Next() {
		select {
		case <-ctx.Done():
			return err
		case <-stop:
			return err
		case <-time.After(wait):
		}
		err = write()
	}
	return err
}

// retryStopKey carries, in a leased outcome's record context, the channel
// that ends its write's retries.
type retryStopKey struct{}

// retryableWrite: the statement failed on its connection, or no
// connection could be opened.
func retryableWrite(err error) bool {
	var ce *pgconn.ConnectError
	return connectionLost(err) || errors.As(err, &ce)
}

// failLeased records a failed leased attempt (already counted) by owner (""
// for a rescue of an expired lease). It returns the write's error, or
// ErrLeaseLost.
func (c *Client) failLeased(ctx context.Context, l *queueLoop, r *attemptResult, owner string) error {
	j := r.job
	var rec failRecord
	var ok bool
	err := c.retryLeaseWrite(ctx, func() (err error) {
		rec, ok, err = c.writeFailure(ctx, c.pool, c.sql.failLeased, int32(j.Attempt), j, r.err, owner)
		return err
	})
	switch {
	case err != nil:
		l.log.Warn("could not record a leased job's failure; its lease will expire and it will be retried",
			zap.Int64("job_id", j.ID), zap.Error(err))
		r.outcome = outcomeCommitError
		return err
	case !ok:
		r.outcome = outcomeLeaseLost
		return ErrLeaseLost
	}
	r.recorded(rec)
	return nil
}

// leaseLoop extends this client's leases and rescues expired ones of its
// queues, every LeaseDuration/3, until ctx ends.
func (c *Client) leaseLoop(ctx context.Context) {
	queues := make([]string, 0, len(c.loops))
	for q := range c.loops {
		queues = append(queues, q)
	}
	own := &leaseConn{pool: c.pool}
	defer own.drop()
	every(ctx, c.cfg.LeaseDuration/3, func() {
		var db leaseDB = c.pool
		if conn, err := own.get(ctx); err == nil {
			db = conn
		} else if ctx.Err() == nil {
			c.log.Warn("the lease heartbeat's own connection failed; using the pool", zap.Error(err))
		}
		if err := c.extendLeases(ctx, db); err != nil {
			own.drop()
		}
		c.rescueExpired(ctx, db, queues)
	})
}

// leaseDB is what the lease loop's statements run on: its own connection,
// or the pool.
type leaseDB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// leaseConn is the lease heartbeat's own connection, opened like the
// pool's (its BeforeConnect and AfterConnect included) but outside it:
// handlers that hold every pool connection (a small pool with
// AllowSmallPool) must not keep the heartbeat from extending their leases,
// or a healthy process loses them all and its jobs run twice
// (TestLeaseHeartbeatNotStarvedByThePool).
type leaseConn struct {
	pool *pgxpool.Pool
	conn *pgx.Conn
}

func (lc *leaseConn) get(ctx context.Context) (*pgx.Conn, error) {
	if lc.conn != nil && !lc.conn.IsClosed() {
		return lc.conn, nil
	}
	pc := lc.pool.Config()
	cc := pc.ConnConfig.Copy()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(ctx, cc); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	if pc.AfterConnect != nil {
		if err := pc.AfterConnect(ctx, conn); err != nil {
			closeConn(conn)
			return nil, err
		}
	}
	lc.conn = conn
	return conn, nil
}

// drop closes the connection after a failed statement; the next tick opens
// another.
func (lc *leaseConn) drop() {
	if lc.conn != nil {
		closeConn(lc.conn)
		lc.conn = nil
	}
}

// extendLeases extends every lease this client holds in one statement and
// cancels the handlers of jobs that are no longer its own.
func (c *Client) extendLeases(ctx context.Context, db leaseDB) error {
	var ids []int64
	runs := map[int64]*leasedRun{}
	c.leases.Range(func(k, v any) bool {
		ids = append(ids, k.(int64))
		runs[k.(int64)] = v.(*leasedRun)
		return true
	})
	if len(ids) == 0 {
		return nil
	}
	began := time.Now()
	rows, err := db.Query(ctx, c.sql.extendLeases, ids, float64(c.cfg.LeaseDuration.Microseconds()), c.id)
	held := map[int64]bool{}
	locked := 0
	if err == nil {
		var id int64
		var extended bool
		_, err = pgx.ForEachRow(rows, []any{&id, &extended}, func() error {
			// Not extended: another session holds the row's lock; still
			// ours, looked at again at the next extension.
			held[id] = true
			if !extended {
				locked++
			}
			return nil
		})
	}
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("extending leases failed", zap.Error(err), zap.Int("jobs", len(ids)))
		}
		return err
	}
	if locked > 0 {
		c.log.Debug("leases not extended: their rows are locked by another session (a rescue, a cancel, a completion)", zap.Int("jobs", locked))
	}
	c.metrics.heartbeats.Inc()
	c.metrics.heartbeatT.Observe(time.Since(began).Seconds())
	for _, id := range ids {
		if !held[id] {
			runs[id].cancel(ErrLeaseLost) // the run looked at, not one registered since
		}
	}
	return nil
}

// rescueExpired records the attempts of expired leases on queues as failed
// (retry with backoff, or failed for good), up to 100 per call.
func (c *Client) rescueExpired(ctx context.Context, db leaseDB, queues []string) {
	type expired struct {
		job Job
	}
	var found []expired
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, c.sql.expiredLeases, queues)
		if err != nil {
			return err
		}
		found = found[:0]
		for rows.Next() {
			var e expired
			var attempts, maxAttempts int32
			if err := rows.Scan(&e.job.ID, &e.job.Queue, &e.job.Kind, &attempts, &maxAttempts); err != nil {
				rows.Close()
				return err
			}
			e.job.Attempt, e.job.MaxAttempts = int(attempts), int(maxAttempts)
			found = append(found, e)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for i := range found {
			j := &found[i].job
			if _, _, err := c.writeFailure(ctx, tx, c.sql.failLeased, int32(j.Attempt), j, errLeaseExpired, ""); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("rescuing expired leases failed", zap.Error(err))
		}
		return
	}
	for i := range found {
		j := &found[i].job
		c.metrics.rescued.WithLabelValues(j.Queue).Inc()
		c.log.Named("worker").Warn("rescued a job whose lease expired", zap.Int64("job_id", j.ID), zap.String("queue", j.Queue),
			zap.String("kind", j.Kind), zap.Int("attempt", j.Attempt))
		if l, ok := c.loops[j.Queue]; ok {
			l.wake(sourceScheduled, c.backoff(j))
		}
	}
}
