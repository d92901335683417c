package queue

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// batch is claimed jobs with their open claim transaction, on a connection
// held from the pool until the transaction ends.
type batch struct {
	conn *pgxpool.Conn
	tx   pgx.Tx
	jobs []claimedJob
	// lost is set on a job claimed by claimRecovered: its previous attempt
	// began and recorded no outcome.
	lost *lostAttempt
	// leased: the jobs are of leased kinds (a batch is all leased or none).
	leased bool
	// started: the claim already started the leased jobs and committed
	// (claimLeased): no connection, no transaction.
	started bool

	mu      sync.Mutex
	next    int            // jobs[:next] were started or skipped
	cancels map[int64]bool // to skip: cancelled through this client before they started
	// txOnly: cancels requested only by a handler's CancelTx, withdrawn
	// when that handler's attempt fails (its transaction's cancel rolled
	// back with it: TestCancelTxOfANeighbourRolledBack).
	txOnly  map[int64]bool
	skipped map[int64]bool // cancels recorded by the batch's commit
	// runningID is the job whose handler runs now (0: none), stop cancels
	// its handler's context.
	runningID   int64
	stopRunning context.CancelCauseFunc
	done        chan struct{} // closed when the batch has ended
	// firstStarted, when not nil, is closed once the first handler starts
	// or the executor ends without one (signalStarted): the dispatcher
	// waits for it after a wake-up's claim (handOff).
	firstStarted chan struct{}
	firstOnce    sync.Once
	// freeSlot gives the dispatcher's slot back once (nil: no slot), so
	// that the next claim overlaps this batch's commit.
	freeSlot func()
	// pid is the claim transaction's backend (0 without one): a stop
	// notification is obeyed only while a session waits for a job row it
	// holds (stopConfirmed).
	pid uint32
	// discard: release closes the connection instead of returning it to
	// the pool: a statement on it failed because the server no longer has
	// it (staleStatement), or a handler changed a session setting
	// (settingChanges).
	discard bool
}

type claimedJob struct {
	job  Job
	wait time.Duration // from due to claim
	// handed is the copy of job its handler gets: a handler that changes
	// it (json.Unmarshal into it, say) cannot move another job or its own
	// attempt count (TestHandlerChangesItsJob).
	handed Job
}

// lostAttempt is the record of an attempt that began and recorded no
// outcome.
type lostAttempt struct {
	attempt   int    // the attempt number that began
	isolation int    // how it ran: isolationNone, isolationRerun, isolationAlone
	clientID  string // the client that ran it
}

// release ends the transaction (rolling back if still open) and returns the
// connection to the pool, which discards it if it is not idle. A
// connection to discard is closed first, so the pool discards it too.
func (b *batch) release() {
	if b.conn == nil {
		return
	}
	if b.discard {
		closeConn(b.conn.Conn())
	} else if b.conn.Conn().PgConn().TxStatus() != 'I' {
		rollback(b.tx)
	}
	b.conn.Release()
	b.conn = nil
}

// begin marks jobs[i] started unless it was cancelled; false means skip it.
func (b *batch) begin(i int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next = i + 1
	return !b.cancels[b.jobs[i].job.ID]
}

// ids is the ids of b's jobs, in claim order.
func (b *batch) ids() []int64 {
	ids := make([]int64, len(b.jobs))
	for i, cj := range b.jobs {
		ids[i] = cj.job.ID
	}
	return ids
}

// stop marks the batch as starting nothing more and returns the ids of the
// jobs it did not start.
func (b *batch) stop() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []int64
	for _, cj := range b.jobs[b.next:] {
		ids = append(ids, cj.job.ID)
	}
	b.next = len(b.jobs)
	return ids
}

// requestCancel asks the batch to skip job id; false if it already started.
func (b *batch) requestCancel(id int64) bool { return b.requestCancelBy(id, false) }

// requestCancelBy is requestCancel; byTx: the request is a handler's
// CancelTx, which a failure of that handler withdraws (withdrawCancels).
func (b *batch) requestCancelBy(id int64, byTx bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := b.next; i < len(b.jobs); i++ {
		if b.jobs[i].job.ID == id {
			if b.cancels == nil {
				b.cancels, b.txOnly = map[int64]bool{}, map[int64]bool{}
			}
			switch {
			case !b.cancels[id]:
				b.txOnly[id] = byTx
			case !byTx:
				b.txOnly[id] = false
			}
			b.cancels[id] = true
			return true
		}
	}
	return false
}

// withdrawCancels takes back the cancels of ids that only a handler's
// CancelTx asked for, the handler having failed: its transaction's cancel
// rolled back.
func (b *batch) withdrawCancels(ids []int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		if b.txOnly[id] {
			delete(b.cancels, id)
			delete(b.txOnly, id)
		}
	}
}

// running records that job id's handler runs now, stoppable by stop (id 0:
// none runs).
func (b *batch) running(id int64, stop context.CancelCauseFunc) {
	b.mu.Lock()
	b.runningID, b.stopRunning = id, stop
	b.mu.Unlock()
	if id != 0 {
		b.signalStarted()
	}
}

// signalStarted closes firstStarted, if set, once.
func (b *batch) signalStarted() {
	if b.firstStarted != nil {
		b.firstOnce.Do(func() { close(b.firstStarted) })
	}
}

// stopJob cancels job id: its handler's context if it runs now, else it is
// skipped if not started yet.
func (b *batch) stopJob(id int64) {
	b.mu.Lock()
	if b.runningID == id && b.stopRunning != nil {
		b.stopRunning(errCancelledWhileRunning)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.requestCancel(id)
}

// cancelled lists the jobs the batch skipped because they were cancelled.
func (b *batch) cancelled() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []int64
	for _, cj := range b.jobs[:b.next] {
		if b.cancels[cj.job.ID] {
			ids = append(ids, cj.job.ID)
		}
	}
	return ids
}

// wasCancelled reports whether the batch's commit recorded job id cancelled.
func (b *batch) wasCancelled(id int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.skipped[id]
}

type batchKey struct{}

// batchOf returns the batch whose handler ctx belongs to, if any.
func batchOf(ctx context.Context) *batch {
	b, _ := ctx.Value(batchKey{}).(*batch)
	return b
}

// track registers the batch's jobs for Cancel.
func (c *Client) track(b *batch) {
	b.done = make(chan struct{})
	if b.conn != nil {
		b.pid = b.conn.Conn().PgConn().PID()
	}
	for _, cj := range b.jobs {
		c.claimed.Store(cj.job.ID, b)
	}
}

// untrack ends the batch for Cancel.
func (c *Client) untrack(b *batch) {
	for _, cj := range b.jobs {
		c.claimed.CompareAndDelete(cj.job.ID, b)
	}
	close(b.done)
}

// claimedBatch returns the running batch that holds job id, if any.
func (c *Client) claimedBatch(id int64) *batch {
	if v, ok := c.claimed.Load(id); ok {
		return v.(*batch)
	}
	return nil
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

// scanClaimed reads claimCols (and, with lost, the attempt record's columns)
// into b.jobs.
func scanClaimed(b *batch, rows pgx.Rows, lost bool) error {
	for rows.Next() {
		var la lostAttempt
		var laAttempt int32
		var laIsolation int16
		var extra []any
		if lost {
			extra = []any{&laAttempt, &laIsolation, &la.clientID}
		}
		cj, err := scanClaimedJob(rows, extra...)
		if err != nil {
			return err
		}
		b.jobs = append(b.jobs, cj)
		if lost {
			la.attempt, la.isolation = int(laAttempt), int(laIsolation)
			b.lost = &la
		}
	}
	return rows.Err()
}

// scanClaimedJob reads one row of claimCols, then the columns extra.
func scanClaimedJob(rows pgx.Rows, extra ...any) (claimedJob, error) {
	var cj claimedJob
	j := &cj.job
	var prio int16
	var attempts, maxAttempts int32
	var waitSec float64
	var meta *string
	// Into []byte, not json.RawMessage: pgx would run a RawMessage
	// through encoding/json (a validation pass over every payload) where
	// it copies a []byte; PostgreSQL's jsonb is valid JSON already.
	var payload []byte
	dest := []any{&j.ID, &j.Queue, &j.Kind, &payload, &prio, &attempts, &maxAttempts,
		&j.RunAfter, &j.CreatedAt, &j.UniqueKey, &j.LastError, &waitSec, &meta}
	if err := rows.Scan(append(dest, extra...)...); err != nil {
		return cj, err
	}
	j.Payload = payload
	j.Priority, j.Attempt, j.MaxAttempts = int(prio), int(attempts)+1, int(maxAttempts)
	if meta != nil {
		j.Metadata = decodeMetadata(*meta)
	}
	cj.wait = time.Duration(waitSec * float64(time.Second))
	return cj, nil
}

// beginClaim acquires a connection and queues BEGIN (and the idle-timeout
// lift) in pb.
func (c *Client) beginClaim(ctx context.Context) (*batch, *pgx.Batch, error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("acquire connection: %w", err)
	}
	pb := &pgx.Batch{}
	pb.BeginTx(pgx.TxOptions{})
	c.liftIdleTimeout(pb)
	return &batch{conn: conn}, pb, nil
}

// liftIdleTimeout queues, when the claims set one, the claim transaction's
// idle_in_transaction_session_timeout (claimIdleTimeout).
func (c *Client) liftIdleTimeout(pb *pgx.Batch) {
	if c.claimIdleTimeout != "" {
		pb.Queue(`SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', $1::text, true)`, c.claimIdleTimeout)
	}
}

// genericPlan makes the claim statements that follow it in a claim's round
// trip use their generic plan from their first call on a connection,
// keeping plan_cache_mode's value meanwhile in a transaction-local setting of
// our own; the statements put it back themselves as their execution starts
// (planRestoredSQL and genericPlanRestore in store.go), before any handler's
// statement.
// Left to itself PostgreSQL plans a prepared statement afresh for its first
// five calls on every connection (custom plans) before it settles on the
// generic plan it then keeps: with a pool of twenty connections, a quarter
// of the claims of a 10,000-job drain and most of an idle queue's were
// planned, 0.3-0.5 ms each (the claim walks the priorities; its execution
// takes about 0.1 ms), measured with pg_stat_statements (docs/benchmarks.md).
// TestClaimsUseTheGenericPlan.
const (
	genericPlan = `SELECT pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true)
FROM (SELECT pg_catalog.set_config('pgwake.plan_saved', pg_catalog.current_setting('plan_cache_mode'), true)) s`
)

// send runs pb (BEGIN and the claim, or a claim in the open transaction) on
// the batch's connection.
func (b *batch) send(ctx context.Context, pb *pgx.Batch) error {
	br := b.conn.Conn().SendBatch(ctx, pb)
	if tx := br.Tx(); tx != nil {
		b.tx = tx // else chained (beginLook): b.tx is still the transaction
	}
	if err := br.Close(); err != nil {
		b.check(err)
		b.release()
		return fmt.Errorf("claim: %w", err)
	}
	return nil
}

// claim begins a transaction and locks up to n due held-mode jobs of queue
// or up to leasedN leased ones, in one round trip; with a cursor, the scan
// starts after it (and falls back to the head if nothing is there). With
// leasedFirst it first tries claimLeased, which needs no transaction, and
// claims in one only when the head job is of a held kind. With no job due
// it returns nil and the time of the queue's earliest delayed job (zero if
// none). With first (a wake-up's claimFirst statement, "" for none) and one
// job to claim, it tries that and walks the priorities only when it finds
// nothing.
//
// With st (a loop's stream, stream.go), an empty look of a stream
// (st.keep) keeps its transaction open in st.open instead of asking for the
// earliest delayed job, and the next look chains on it: one round trip a
// look.
func (c *Client) claim(ctx context.Context, queue string, n, leasedN int, after *claimCursor, leasedFirst bool, first string, st *streamTx) (*batch, time.Time, error) {
	began := time.Now()
	if leasedFirst && leasedN > 0 {
		st.drop()
		b, held, err := c.claimLeased(ctx, queue, leasedN, after, began)
		switch {
		case err != nil || b != nil:
			return b, time.Time{}, err
		case !held:
			next, err := c.nextDue(ctx, c.pool, queue, false)
			return nil, next, err
		}
		// The head is of a held kind: claim it in a transaction.
	}
	b, pb, err := c.beginLook(ctx, st)
	if err != nil {
		return nil, time.Time{}, err
	}
	scan := func(rows pgx.Rows) error { return scanClaimed(b, rows, false) }
	plain, head, headArgs := c.claimHead(queue, n, leasedN)
	one := first != "" && n <= 1 && leasedN <= 1
	if !one {
		pb.Queue(genericPlan)
	}
	switch {
	case one: // the head priority's first due job, else the walk below
		pb.Queue(first).Query(scan)
		after = nil
	case n <= 1 && leasedN <= 1:
		pb.Queue(c.sql.claimOne, queue).Query(scan)
		after = nil // from the head already
	case after == nil:
		pb.Queue(head, headArgs...).Query(scan)
	case plain:
		pb.Queue(c.sql.claimPlainAfter, queue, n, after.priority, after.runAfter, after.id).Query(scan)
	default:
		// claimAfter takes claim's arguments, then the cursor.
		args := append(headArgs[:len(headArgs):len(headArgs)], after.priority, after.runAfter, after.id)
		pb.Queue(c.sql.claimAfter, args...).Query(scan)
	}
	// The claim statement puts plan_cache_mode back itself
	// (planRestoredSQL).
	if err := b.send(ctx, pb); err != nil {
		return nil, time.Time{}, err
	}
	if len(b.jobs) == 0 && (one || after != nil) {
		// Before concluding that nothing is due: walk the priorities
		// (claimFirst found nothing), or look from the head (nothing after
		// the cursor).
		mb := &pgx.Batch{}
		if one {
			mb.Queue(genericPlan)
			mb.Queue(c.sql.claimOne, queue).Query(scan)
		} else {
			mb.Queue(head, headArgs...).Query(scan)
		}
		if err := b.send(ctx, mb); err != nil {
			return nil, time.Time{}, err
		}
	}
	if len(b.jobs) > 0 {
		b.leased = c.leased[b.jobs[0].job.Kind]
		c.track(b)
		c.hookClaimed(ctx, b, began)
		return b, time.Time{}, nil
	}
	if st != nil && st.keep {
		// Nothing due, and the loop looks again shortly: the next look
		// ends this transaction.
		st.open = b
		return nil, time.Time{}, nil
	}
	// Nothing due: end the transaction and ask for the earliest delayed job
	// in one more round trip.
	next, err := c.nextDue(ctx, b.conn.Conn(), queue, true)
	b.check(err)
	b.release()
	return nil, next, err
}

// claimHead is the claim from the head of the index and its arguments: the
// plain claim when every kind batches (plain: no head to look at first).
func (c *Client) claimHead(queue string, n, leasedN int) (plain bool, stmt string, args []any) {
	alone, leased := c.kinds.alone(), c.leasedKinds
	if len(alone) == 0 && len(leased) == 0 {
		return true, c.sql.claimPlain, []any{queue, n}
	}
	return false, c.sql.claim, []any{queue, n, alone, leased, leasedN}
}

// primeClaims prepares on conn, off any job's path, the statements of the
// held claim's round trips and of the attempt record, with the claims'
// generic plans (genericPlan), by running each once for no queue (queue
// names are not empty) in a transaction it rolls back. A connection's first
// claim would otherwise wait a round trip while the statements are
// described, plan with the catalog caches of a new backend, and the first
// attempt record it sends would wait for its description before the
// handler may start (p90 430 µs of the idle path, docs/benchmarks.md).
func (c *Client) primeClaims(ctx context.Context, conn *pgx.Conn) error {
	// sendStarts runs the record as a statement prepared under its own
	// text; the batch below runs it once too (pgx finds it by that name).
	if _, err := conn.Prepare(ctx, c.sql.recordStarts, c.sql.recordStarts); err != nil {
		return err
	}
	for _, l := range c.loops {
		// claimFirst prepared, not run: it would lock a due job of the
		// queue for a moment, which a wake-up elsewhere could miss. Its
		// plan is made at its first run on the connection (about 0.3 ms,
		// once).
		if _, err := conn.Prepare(ctx, l.first, l.first); err != nil {
			return err
		}
	}
	_, head, headArgs := c.claimHead("", 1, 1)
	pb := &pgx.Batch{}
	pb.Queue(genericPlan)
	pb.Queue(c.sql.claimOne, "")
	pb.Queue(genericPlan) // claimOne put the setting back
	pb.Queue(head, headArgs...)
	pb.Queue(c.sql.next, "")
	pb.Queue(c.sql.recordStarts, []int64{}, "", []int32{}, int32(0), c.id, int16(isolationNone))
	return rolledBack(ctx, conn, pb)
}

// nextDue returns the time of queue's earliest delayed job (zero if none),
// asked on q; with rollback, q's open transaction ends in the same round
// trip.
func (c *Client) nextDue(ctx context.Context, q interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, queue string, rollback bool) (time.Time, error) {
	var ms *float64
	nb := &pgx.Batch{}
	if rollback {
		nb.Queue(genericPlan) // the ROLLBACK puts it back
	}
	nb.Queue(c.sql.next, queue).QueryRow(func(row pgx.Row) error { return row.Scan(&ms) })
	if rollback {
		nb.Queue("ROLLBACK")
	}
	if err := q.SendBatch(ctx, nb).Close(); err != nil {
		return time.Time{}, fmt.Errorf("find next delayed job: %w", err)
	}
	if ms == nil {
		return time.Time{}, nil
	}
	// Far-future jobs (up to year 9999 is allowed) overflow a Duration:
	// clamp, the poll interval bounds the sleep anyway.
	d := min(*ms, float64(maxHintDelay/time.Millisecond))
	return time.Now().Add(time.Duration(d * float64(time.Millisecond))), nil
}

// asyncCommit makes a transaction's commit return before its WAL is
// flushed (synchronous_commit off for that transaction only). The leased
// claim uses it: the handler starts a flush earlier. The job's completion
// commits synchronously, and flushes the claim with it. Only a database
// crash in between (before the WAL writer's next flush) can forget the
// claim: the job is then pending again, its attempt and its started event
// not recorded (docs/semantics.md). The held completion sets the same
// setting inside its success statement when every job of the batch
// succeeded without touching the transaction and no cancel was asked
// (complete, the succeed statement's $3).
const asyncCommit = `SELECT pg_catalog.set_config('synchronous_commit', 'off', true)`

// claimLeased claims and starts up to n due leased jobs of queue in one
// statement with no transaction around it (claimLeased in store.go): one
// round trip and one commit. held reports that the head job is of a held
// kind: nothing was claimed. With a cursor, the scan starts after it and
// falls back to the head if nothing is there.
func (c *Client) claimLeased(ctx context.Context, queue string, n int, after *claimCursor, began time.Time) (b *batch, held bool, err error) {
	lease := float64(c.cfg.LeaseDuration.Microseconds())
	b = &batch{leased: true, started: true}
	for {
		stmt, args := c.sql.claimLeased, []any{queue, lease, c.id, c.leasedKinds, n}
		if after != nil {
			stmt, args = c.sql.claimLeasedAfter, append(args, after.priority, after.runAfter, after.id)
		}
		// One round trip, one implicit transaction (a batch ends with one
		// Sync): its commit does not wait for the WAL flush (asyncCommit).
		pb := &pgx.Batch{}
		pb.Queue(asyncCommit)
		pb.Queue(stmt, args...).Query(func(rows pgx.Rows) (err error) {
			held, err = scanLeasedClaim(b, rows)
			return err
		})
		// The statement commits on the server: once sent, its answer must
		// be read, or a shutdown that cancels ctx meanwhile leaves the jobs
		// it started running under a lease no handler holds, until the
		// lease expires and a failed attempt is counted for a handler that
		// never ran (TestLeasedClaimInFlightAtShutdownIsNotLeftRunning). So
		// ctx decides whether it is sent, not whether its answer is read.
		if err = ctx.Err(); err != nil {
			return nil, false, fmt.Errorf("claim: %w", err)
		}
		sctx, cancel := c.recordContext(ctx)
		err = c.pool.SendBatch(sctx, pb).Close()
		cancel()
		if err != nil {
			return nil, false, fmt.Errorf("claim: %w", err)
		}
		if held || len(b.jobs) > 0 || after == nil {
			break
		}
		after = nil // nothing after the cursor: look from the head
	}
	if held || len(b.jobs) == 0 {
		return nil, held, nil
	}
	c.hookClaimed(ctx, b, began)
	return b, false, nil
}

// scanLeasedClaim reads claimLeased's rows into b.jobs; held reports the
// row of a held head, which is not b's.
func scanLeasedClaim(b *batch, rows pgx.Rows) (held bool, err error) {
	defer rows.Close()
	for rows.Next() {
		var started bool
		cj, err := scanClaimedJob(rows, &started)
		if err != nil {
			return false, err
		}
		if !started {
			held = true
			continue
		}
		b.jobs = append(b.jobs, cj)
	}
	return held, rows.Err()
}

// claimRecovered locks one pending job of queue whose attempt began and
// recorded no outcome (its claim transaction is gone: no lock is held), nil
// if there is none.
func (c *Client) claimRecovered(ctx context.Context, queue string) (*batch, error) {
	began := time.Now()
	b, pb, err := c.beginClaim(ctx)
	if err != nil {
		return nil, err
	}
	pb.Queue(c.sql.claimRecovered, queue).Query(func(rows pgx.Rows) error { return scanClaimed(b, rows, true) })
	if err := b.send(ctx, pb); err != nil {
		return nil, err
	}
	if len(b.jobs) == 0 || c.claimedBatch(b.jobs[0].job.ID) != nil {
		// Nothing lost, or a loss of our own that its executor is still
		// settling (it may know the attempt at fault): not ours to rerun.
		b.release()
		return nil, nil
	}
	c.track(b)
	c.hookClaimed(ctx, b, began)
	return b, nil
}

func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}
