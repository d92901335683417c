package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// Client enqueues jobs and, when it has Queues, runs their workers.
type Client struct {
	pool    *pgxpool.Pool
	cfg     Config
	log     *zap.Logger
	sql     statements
	channel string
	metrics *metrics

	id    string // names this client in the waiters and attempts tables
	loops map[string]*queueLoop
	kinds kindStats
	// timeouts is each kind's timeout with the cause its expiry gives
	// (made at New: a per-attempt fmt.Errorf was three allocations a job).
	timeouts map[string]kindTimeout
	leased   map[string]bool // Config.LeasedKinds
	// onlyLeased: every handler's kind is leased (any other due job is of
	// a kind this client cannot run).
	onlyLeased bool
	// leasedKinds is Config.LeasedKinds, never nil (a nil slice is a NULL
	// array in SQL, and "<> ALL(NULL)" is never true).
	leasedKinds []string
	// leases maps the id of every leased job running in this client to
	// its *leasedRun.
	leases sync.Map
	// early holds cancels of leased jobs that were not (yet) running here
	// (earlyCancels).
	early       earlyCancels
	completions completer // leased successes, written together
	running     atomic.Bool
	// claimIdleTimeout, when not empty, is set as the claim transaction's
	// idle_in_transaction_session_timeout (see claimIdleTimeoutFor). Written
	// by Run before the dispatchers start.
	claimIdleTimeout string
	// claimed maps the id of every job in a running batch to its batch, so
	// Cancel can skip a job that is claimed but not started.
	claimed sync.Map
	// exclusive is held shared by every running batch, and exclusively by
	// a job re-run alone to find out whether it kills its process.
	exclusive sync.RWMutex

	mu      sync.Mutex
	started *started // workers started by Start, until Stop

	// pauseResync asks pausePoll to re-read the paused queues (the
	// listener reconnected, or a pause or resume was notified).
	pauseResync chan struct{}

	// signals are the test signals (testsignal.go); nil outside this
	// package's tests.
	signals *testSignals
	// warmTimeout replaces warmPoolTimeout when set (tests on a loaded
	// machine).
	warmTimeout time.Duration
	// handOff replaces the const handOff when set (tests).
	handOff time.Duration
	// recordTimeout replaces recordTimeout when set (tests of batches that
	// outlast it).
	recordTimeout time.Duration
}

// MinPoolConns is the fewest connections cfg's workers need from the pool:
// one per worker slot (a running batch holds its claim transaction's
// connection), one per queue (its dispatcher claims and marks itself idle
// while every slot is busy) and one for recording attempts and housekeeping.
// Handlers that use the pool themselves (Client.Enqueue instead of EnqueueTx,
// say) need theirs on top. The LISTEN connection is not from the pool, nor
// is the lease heartbeat's (with LeasedKinds).
func MinPoolConns(cfg Config) int {
	cfg = cfg.withDefaults()
	if len(cfg.Queues) == 0 {
		return 1
	}
	n := 1
	for _, qc := range cfg.Queues {
		n += qc.MaxWorkers + 1
	}
	return n
}

// New returns a Client on pool. It validates cfg (after filling defaults) and
// registers metrics; it does not touch the database. With Queues, it returns
// a *PoolTooSmallError (errors.Is ErrPoolTooSmall) when the pool's MaxConns
// is below MinPoolConns(cfg), unless cfg.AllowSmallPool is set.
func New(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if need, mc := MinPoolConns(cfg), int(pool.Config().MaxConns); len(cfg.Queues) > 0 && mc < need {
		if !cfg.AllowSmallPool {
			return nil, &PoolTooSmallError{MaxConns: mc, Need: need}
		}
		cfg.Logger.Warn("pool is smaller than the workers need; concurrency is capped by the pool",
			zap.Int("pool_max_conns", mc), zap.Int("need", need))
	}
	c := &Client{
		pool:     pool,
		cfg:      cfg,
		log:      cfg.Logger,
		sql:      newStatements(cfg.Schema),
		channel:  WakeChannel(cfg.Schema),
		loops:    map[string]*queueLoop{},
		kinds:    newKindStats(cfg),
		timeouts: newKindTimeouts(cfg),
		leased:   map[string]bool{},
		id:       newClientID(),

		pauseResync: make(chan struct{}, 1),
	}
	c.leasedKinds = append([]string{}, cfg.LeasedKinds...)
	for _, k := range cfg.LeasedKinds {
		c.leased[k] = true
	}
	c.onlyLeased = len(cfg.Handlers) > 0
	for k := range cfg.Handlers {
		c.onlyLeased = c.onlyLeased && c.leased[k]
	}
	m, err := newMetrics(cfg.Registerer, c)
	if err != nil {
		return nil, err
	}
	c.metrics = m
	for name, qc := range cfg.Queues {
		c.loops[name] = newQueueLoop(c, name, qc)
	}
	return c, nil
}

// Schema returns the schema the client works in.
func (c *Client) Schema() string { return c.cfg.Schema }

// Pool returns the client's pool.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// WakeChannel is the NOTIFY channel of a schema's queues.
func WakeChannel(schema string) string { return schema + "_wake" }

func newClientID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Enqueue enqueues one job in its own transaction.
func (c *Client) Enqueue(ctx context.Context, job NewJob) (EnqueueResult, error) {
	res, err := c.EnqueueMany(ctx, []NewJob{job})
	if err != nil {
		return EnqueueResult{}, err
	}
	return res[0], nil
}

// EnqueueTx enqueues one job in the caller's transaction: the job, its event
// and the wake-up exist only if tx commits.
func (c *Client) EnqueueTx(ctx context.Context, tx pgx.Tx, job NewJob) (EnqueueResult, error) {
	res, err := c.EnqueueManyTx(ctx, tx, []NewJob{job})
	if err != nil {
		return EnqueueResult{}, err
	}
	return res[0], nil
}

// EnqueueMany enqueues jobs in one statement (one round trip, one NOTIFY per
// queue) in its own transaction. Results are in the order of jobs.
func (c *Client) EnqueueMany(ctx context.Context, jobs []NewJob) ([]EnqueueResult, error) {
	// One statement is its own transaction: no BEGIN/COMMIT round trips.
	return c.enqueue(ctx, c.pool, jobs)
}

// EnqueueManyTx is EnqueueMany in the caller's transaction.
func (c *Client) EnqueueManyTx(ctx context.Context, tx pgx.Tx, jobs []NewJob) ([]EnqueueResult, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: nil transaction", ErrInvalidConfig)
	}
	return c.enqueue(ctx, tx, jobs)
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (c *Client) enqueue(ctx context.Context, q querier, jobs []NewJob) (_ []EnqueueResult, err error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	if h := c.cfg.Hooks.BeforeEnqueue; h != nil {
		// The hook may set each job's Metadata: on a copy of the slice.
		jobs = slices.Clone(jobs)
		if done := h(ctx, jobs); done != nil {
			defer func() { done(err) }()
		}
	}
	n := len(jobs)
	a := newEnqueueArgs(n)
	for i, j := range jobs {
		p, err := c.prepare(i, j)
		if err != nil {
			return nil, err
		}
		a.set(i, p)
	}
	ids, dups, heldUntil, err := c.send(ctx, q, a)
	if err != nil {
		return nil, fmt.Errorf("queue: enqueue: %w", c.notMigrated(err))
	}
	if len(ids) != n || len(dups) != n {
		return nil, fmt.Errorf("queue: enqueue: internal error: %d ids for %d jobs", len(ids), n)
	}
	results := make([]EnqueueResult, n)
	for i := range results {
		results[i] = EnqueueResult{ID: ids[i], Duplicate: dups[i]}
		if i < len(heldUntil) && heldUntil[i] != nil {
			results[i].HeldUntil = *heldUntil[i]
		}
	}
	for i, r := range results {
		if !r.Duplicate {
			c.metrics.countEnqueued(a.queues[i], a.kinds[i])
		}
	}
	return results, nil
}

// enqueueArgs are enqueue_jobs' arguments: one element per job.
type enqueueArgs struct {
	kinds, payloads, queues []string
	runAfter                []*time.Time
	delays                  []time.Duration
	prios, maxAtt           []int32
	keys                    []*string
	// Scopes, holds, periods and metadata stay nil (NULL) unless a job sets
	// one: the usual enqueue pays nothing for them.
	scopes, holds []*string
	periods       []*time.Duration
	metas         []*string
}

func newEnqueueArgs(n int) *enqueueArgs {
	return &enqueueArgs{kinds: make([]string, n), payloads: make([]string, n), queues: make([]string, n),
		runAfter: make([]*time.Time, n), delays: make([]time.Duration, n), prios: make([]int32, n),
		maxAtt: make([]int32, n), keys: make([]*string, n)}
}

// set puts the i-th prepared job in the arguments.
func (a *enqueueArgs) set(i int, p prepared) {
	n := len(a.kinds)
	a.kinds[i], a.payloads[i], a.queues[i], a.runAfter[i] = p.kind, string(p.payload), p.queue, p.runAfter
	a.delays[i], a.prios[i], a.maxAtt[i], a.keys[i] = time.Duration(p.delayMicros)*time.Microsecond, int32(p.priority), p.maxAttempts, p.uniqueKey
	if p.uniqueScope != nil || p.uniqueHold != nil || p.uniquePeriod != nil {
		if a.scopes == nil {
			a.scopes, a.holds, a.periods = make([]*string, n), make([]*string, n), make([]*time.Duration, n)
		}
		a.scopes[i], a.holds[i], a.periods[i] = p.uniqueScope, p.uniqueHold, p.uniquePeriod
	}
	if p.metadata != nil {
		if a.metas == nil {
			a.metas = make([]*string, n)
		}
		m := string(p.metadata)
		a.metas[i] = &m
	}
}

// send inserts the jobs through the SQL API: enqueue_jobs (rows, events,
// wake-ups and unique keys in one statement, as every other client gets
// them), or, for one job without a unique key, its scalar enqueue_one,
// which does the same for 20-30 % less of the server's CPU
// (migration 0021). It returns the ids, duplicate flags and period ends.
func (c *Client) send(ctx context.Context, q querier, a *enqueueArgs) (ids []int64, dups []bool, heldUntil []*time.Time, err error) {
	if len(a.kinds) == 1 && a.keys[0] == nil && a.scopes == nil {
		var meta *string
		if a.metas != nil {
			meta = a.metas[0]
		}
		var id int64
		err := q.QueryRow(ctx, c.sql.enqueueOne, a.kinds[0], a.payloads[0], a.queues[0], a.runAfter[0], a.delays[0],
			a.prios[0], a.maxAtt[0], meta).Scan(&id)
		return []int64{id}, []bool{false}, nil, err
	}
	rows, err := q.Query(ctx, c.sql.enqueue, a.kinds, a.payloads, a.queues, a.runAfter, a.delays, a.prios, a.maxAtt,
		a.keys, a.scopes, a.holds, a.periods, a.metas)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&ids, &dups, &heldUntil}, func() error { return nil })
	}
	return ids, dups, heldUntil, err
}

// CountEnqueued adds n jobs of kind on queue to pgwake_queue_enqueued_total,
// for jobs this process inserted with a statement of its own (the Watermill
// publisher's fan-out function) rather than with Enqueue.
func (c *Client) CountEnqueued(queue, kind string, n int) {
	for range n {
		c.metrics.countEnqueued(queue, kind)
	}
}

// Cancel marks a pending job cancelled (with a cancelled event). A job this
// client has claimed but not started is skipped and recorded cancelled by its
// batch, without waiting for the batch's other jobs. A job whose handler is
// running now (in held mode, in any process) is told to stop: its handler's
// context is cancelled and the attempt is recorded cancelled (no retry);
// Cancel returns once that is committed. A worker that does not get the
// notification (its LISTEN connection is down) finishes the attempt first.
// From a handler, pass the handler's ctx (or one derived from it) to cancel
// a job of its own batch: with another context Cancel waits for the batch,
// which waits for the handler, until that context ends. CancelTx on the
// handler's tx does not wait.
func (c *Client) Cancel(ctx context.Context, id int64) error {
	if b := c.claimedBatch(id); b != nil && b.requestCancel(id) {
		if batchOf(ctx) == b {
			// Called from a handler of that batch: the batch records the
			// cancel when it commits.
			return nil
		}
		select {
		case <-b.done:
		case <-ctx.Done():
			return fmt.Errorf("queue: cancel job %d: %w", id, ctx.Err())
		}
		if b.wasCancelled(id) {
			return nil
		}
	}
	// A held-mode job whose handler runs holds its row locked until the
	// attempt ends: ask its worker, wherever it is, to cancel the handler
	// and record the attempt cancelled. The cancel below waits for the row.
	var before JobState
	if err := c.pool.QueryRow(ctx, c.sql.jobState, id).Scan(&before); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("queue: cancel job %d: %w", id, c.notMigrated(err))
	}
	if before == StatePending {
		if _, err := c.pool.Exec(ctx, c.sql.notify, c.channel, stopPrefix+strconv.FormatInt(id, 10)); err != nil {
			return fmt.Errorf("queue: cancel job %d: %w", id, c.notMigrated(err))
		}
	}
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.CancelTx(ctx, tx, id) })
	if errors.Is(err, ErrNotFound) && before == StatePending {
		// Its worker recorded the attempt cancelled first.
		var state JobState
		if c.pool.QueryRow(ctx, c.sql.jobState, id).Scan(&state) == nil && state == StateCancelled {
			return nil
		}
	}
	return err
}

// CancelTx is Cancel in the caller's transaction. From a handler, on its
// own transaction, it cancels a job of the same batch without waiting (the
// job is skipped) or the handler's own job (which then ends cancelled, not
// succeeded). Unlike Cancel it does not tell a running handler to stop
// (that notification would outlive a rollback of tx): a held job whose
// handler runs is locked by its claim transaction, so CancelTx waits for
// the attempt to end and then cancels only if the job is still pending
// (ErrNotFound after a success). To stop a running job, use Cancel.
func (c *Client) CancelTx(ctx context.Context, tx pgx.Tx, id int64) error {
	rows, err := tx.Query(ctx, c.sql.cancel, []int64{id})
	if err != nil {
		return fmt.Errorf("queue: cancel job %d: %w", id, c.notMigrated(err))
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("queue: cancel job %d: %w", id, c.notMigrated(err))
	}
	if n == 0 {
		return fmt.Errorf("%w: cancel job %d: not pending", ErrNotFound, id)
	}
	if jt, ok := tx.(*jobTx); ok {
		r := jt.root()
		r.cancels = append(r.cancels, id)
		if jt.batch != nil {
			jt.batch.requestCancelBy(id, true)
		}
	}
	return nil
}

// Retry puts a failed job back to pending, due now, with a retried event and
// a wake-up. Its attempts are kept; max attempts grows by one if needed so it
// runs at least once more.
// When its unique key is held by another job now, it stays failed and Retry
// returns a *UniqueKeyHeldError (errors.Is ErrUniqueKeyHeld).
func (c *Client) Retry(ctx context.Context, id int64) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.RetryTx(ctx, tx, id) })
}

// RetryTx is Retry in the caller's transaction.
func (c *Client) RetryTx(ctx context.Context, tx pgx.Tx, id int64) error {
	var ok bool
	if err := tx.QueryRow(ctx, c.sql.retry, id).Scan(&ok); err != nil {
		if held := uniqueKeyHeld(id, err); held != nil {
			return held
		}
		return fmt.Errorf("queue: retry job %d: %w", id, c.notMigrated(err))
	}
	if !ok {
		return fmt.Errorf("%w: retry job %d: not failed", ErrNotFound, id)
	}
	return nil
}
