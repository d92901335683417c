package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/sqlident"
)

// Client enqueues jobs and, when it has Queues, runs their workers.
type Client struct {
	pool    *pgxpool.Pool
	cfg     Config
	log     *zap.Logger
	sql     statements
	channel string
	metrics *metrics

	id      string // names this client in the waiters table
	loops   map[string]*queueLoop
	running atomic.Bool
	// claimIdleTimeout, when not empty, is set as the claim transaction's
	// idle_in_transaction_session_timeout (see claimIdleTimeoutFor). Written
	// by Run before the dispatchers start.
	claimIdleTimeout string

	mu      sync.Mutex
	runDone chan struct{}
}

// ErrAlreadyRunning is returned by Run when the client is already running.
var ErrAlreadyRunning = errors.New("queue: client is already running")

// ErrNoQueues is returned by Run when Config.Queues is empty.
var ErrNoQueues = errors.New("queue: no queues configured; set Config.Queues to run workers")

// New returns a Client on pool. It validates cfg (after filling defaults) and
// registers metrics; it does not touch the database.
func New(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{
		pool:    pool,
		cfg:     cfg,
		log:     cfg.Logger,
		sql:     newStatements(cfg.Schema),
		channel: WakeChannel(cfg.Schema),
		loops:   map[string]*queueLoop{},
		id:      newClientID(),
	}
	m, err := newMetrics(cfg.Registerer, c)
	if err != nil {
		return nil, err
	}
	c.metrics = m
	workers := 0
	for name, qc := range cfg.Queues {
		c.loops[name] = newQueueLoop(c, name, qc)
		workers += qc.MaxWorkers
	}
	// Each running claim transaction holds a pool connection, and the
	// dispatchers need one to claim: a smaller pool caps concurrency and can
	// starve handlers that use the pool themselves.
	if mc := int(pool.Config().MaxConns); workers > 0 && mc < workers+len(cfg.Queues) {
		c.log.Warn("pool is smaller than the workers need; concurrency is capped by the pool",
			zap.Int("pool_max_conns", mc), zap.Int("workers", workers), zap.Int("queues", len(cfg.Queues)))
	}
	return c, nil
}

// Schema returns the schema the client works in.
func (c *Client) Schema() string { return c.cfg.Schema }

// Pool returns the client's pool.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// WakeChannel is the NOTIFY channel of a schema's queues.
func WakeChannel(schema string) string { return schema + "_wake" }

// statements holds the client's SQL, with the schema quoted in.
type statements struct {
	enqueue, enqueueOne, claim, claimAfter, next, succeed, fail, cancel, retry string
	setWaiter, heartbeat, dropWaiters, pruneWaiters, uniqueHolders             string
	deleteFinished                                                             string
}

func newStatements(schema string) statements {
	jobs := sqlident.Quote(schema, "jobs")
	events := sqlident.Quote(schema, "events")
	waiters := sqlident.Quote(schema, "waiters")
	wakeNeeded := sqlident.Quote(schema, "wake_needed")
	enqueueTail := `
	ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state = 'pending' DO NOTHING
	RETURNING id, queue, kind, run_after, unique_key
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt, data)
	SELECT id, 'enqueued', queue, kind, 0, jsonb_build_object('run_after', run_after) FROM ins ORDER BY id
), wake AS (
	SELECT pg_notify($9, queue || CASE WHEN min(run_after) > clock_timestamp()
		THEN '|' || ceil(extract(epoch FROM min(run_after) - clock_timestamp()) * 1000)::bigint
		ELSE '' END)
	FROM ins GROUP BY queue HAVING ` + wakeNeeded + `(queue)
)
SELECT id, unique_key, (SELECT count(*) FROM wake) FROM ins`
	return statements{
		// One statement: insert, append events, and one NOTIFY per queue
		// that a sleeping worker waits on (see wake_needed in migration
		// 0004). The payload is the queue, plus "|<ms>" when the earliest job
		// of the queue is delayed by that many milliseconds.
		enqueue: `
WITH input AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::smallint[], $5::timestamptz[], $6::bigint[], $7::int[], $8::text[])
		WITH ORDINALITY AS t(queue, kind, payload, priority, run_after, delay_us, max_attempts, unique_key, ord)
), ins AS (
	INSERT INTO ` + jobs + ` (queue, kind, payload, priority, run_after, max_attempts, unique_key)
	SELECT queue, kind, payload, priority, coalesce(run_after, now() + delay_us * interval '1 microsecond'), max_attempts, unique_key
	FROM input ORDER BY ord` + enqueueTail,

		// The same for one job, without the arrays: the common case of a
		// web request enqueuing one job is cheaper to plan and execute.
		enqueueOne: `
WITH ins AS (
	INSERT INTO ` + jobs + ` (queue, kind, payload, priority, run_after, max_attempts, unique_key)
	VALUES ($1, $2, $3::jsonb, $4, coalesce($5, now() + $6::bigint * interval '1 microsecond'), $7, $8)` + enqueueTail,

		claim: claimSQL(jobs, ""),
		// The same, starting after the last job this worker claimed: under a
		// backlog the head of the claim index fills with entries of finished
		// jobs (dead until vacuum), and a scan from the head steps over all
		// of them on every claim.
		claimAfter: claimSQL(jobs, "AND (priority, run_after, id) > ($3::smallint, $4::timestamptz, $5::bigint)"),

		// Milliseconds until the queue's earliest future job, NULL if none.
		// The claim index is ordered by priority first, so walk the queue's
		// distinct priorities (one index probe each) and take the earliest
		// future run_after of each: a few probes instead of a second index
		// on every enqueue.
		next: `
WITH RECURSIVE p(priority) AS (
	(SELECT priority FROM ` + jobs + ` WHERE state = 'pending' AND queue = $1 ORDER BY priority LIMIT 1)
	UNION ALL
	SELECT (SELECT j.priority FROM ` + jobs + ` j
		WHERE j.state = 'pending' AND j.queue = $1 AND j.priority > p.priority ORDER BY j.priority LIMIT 1)
	FROM p WHERE p.priority IS NOT NULL
)
SELECT extract(epoch FROM min((
	SELECT j.run_after FROM ` + jobs + ` j
	WHERE j.state = 'pending' AND j.queue = $1 AND j.priority = p.priority AND j.run_after > now()
	ORDER BY j.run_after LIMIT 1)) - clock_timestamp()) * 1000
FROM p WHERE p.priority IS NOT NULL`,

		succeed: `
WITH j AS (
	UPDATE ` + jobs + ` SET state = 'succeeded', attempts = attempts + 1, finished_at = clock_timestamp()
	WHERE id = ANY($1)
	RETURNING id, queue, kind, attempts
)
INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt)
SELECT id, 'succeeded', queue, kind, attempts FROM j ORDER BY id`,

		// $1 id, $2 attempts seen at claim, $3 error, $4 backoff µs.
		// Returns the new state and the ms until the retry.
		fail: `
WITH j AS (
	UPDATE ` + jobs + ` SET
		attempts = attempts + 1,
		last_error = $3,
		state = CASE WHEN attempts + 1 >= max_attempts THEN 'failed' ELSE 'pending' END,
		run_after = CASE WHEN attempts + 1 >= max_attempts THEN run_after
			ELSE clock_timestamp() + $4 * interval '1 microsecond' END,
		finished_at = CASE WHEN attempts + 1 >= max_attempts THEN clock_timestamp() END
	WHERE id = $1 AND attempts = $2 AND state = 'pending'
	RETURNING id, queue, kind, attempts, state, run_after
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt, data)
	SELECT id, CASE WHEN state = 'failed' THEN 'failed' ELSE 'retry_scheduled' END, queue, kind, attempts,
		CASE WHEN state = 'failed' THEN jsonb_build_object('error', $3::text)
		ELSE jsonb_build_object('error', $3::text, 'run_after', run_after) END
	FROM j
), wake AS (
	SELECT pg_notify($5, queue || '|' || ceil(extract(epoch FROM run_after - clock_timestamp()) * 1000)::bigint)
	FROM j WHERE state = 'pending'
)
SELECT state, extract(epoch FROM run_after - clock_timestamp()) * 1000, (SELECT count(*) FROM wake) FROM j`,

		setWaiter: `INSERT INTO ` + waiters + ` (queue, client_id, idle) VALUES ($1, $2, $3)
ON CONFLICT (queue, client_id) DO UPDATE SET idle = EXCLUDED.idle, heartbeat_at = now()`,
		// A missing row (crash recovery empties the unlogged table) comes
		// back idle: an extra NOTIFY is harmless, a missing one costs latency.
		heartbeat: `INSERT INTO ` + waiters + ` (queue, client_id) SELECT unnest($1::text[]), $2
ON CONFLICT (queue, client_id) DO UPDATE SET heartbeat_at = now()`,
		uniqueHolders:  `SELECT unique_key, id FROM ` + jobs + ` WHERE unique_key = ANY($1) AND state = 'pending'`,
		dropWaiters:    `DELETE FROM ` + waiters + ` WHERE client_id = $1`,
		pruneWaiters:   `DELETE FROM ` + waiters + ` WHERE heartbeat_at < now() - interval '10 minutes'`,
		deleteFinished: deleteFinishedSQL(schema),

		cancel: `
WITH j AS (
	UPDATE ` + jobs + ` SET state = 'cancelled', finished_at = clock_timestamp()
	WHERE id = $1 AND state = 'pending'
	RETURNING id, queue, kind, attempts
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt)
	SELECT id, 'cancelled', queue, kind, attempts FROM j
)
SELECT id FROM j`,

		retry: `
WITH j AS (
	UPDATE ` + jobs + ` SET state = 'pending', run_after = now(), finished_at = NULL,
		max_attempts = greatest(max_attempts, attempts + 1)
	WHERE id = $1 AND state = 'failed'
	RETURNING id, queue, kind, attempts, run_after
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt, data)
	SELECT id, 'retried', queue, kind, attempts, jsonb_build_object('run_after', run_after) FROM j
), wake AS (
	SELECT pg_notify($2, queue) FROM j
)
SELECT id, (SELECT count(*) FROM wake) FROM j`,
	}
}

func claimSQL(jobs, after string) string {
	return `
SELECT id, queue, kind, payload, priority, attempts, max_attempts, run_after, created_at,
	coalesce(unique_key, ''), coalesce(last_error, ''),
	extract(epoch FROM clock_timestamp() - greatest(run_after, created_at))::float8
FROM ` + jobs + `
WHERE state = 'pending' AND queue = $1 AND run_after <= now() ` + after + `
ORDER BY priority, run_after, id
LIMIT $2
FOR UPDATE SKIP LOCKED`
}

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
}

func (c *Client) enqueue(ctx context.Context, q querier, jobs []NewJob) ([]EnqueueResult, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	ps := make([]prepared, len(jobs))
	for i, j := range jobs {
		p, err := c.prepare(i, j)
		if err != nil {
			return nil, err
		}
		ps[i] = p
	}
	results := make([]EnqueueResult, len(ps))
	todo := make([]int, len(ps)) // indexes still to insert
	for i := range todo {
		todo[i] = i
	}
	// A duplicate whose holder finishes between our insert and our lookup is
	// inserted again on the next round; a few rounds settle any race.
	for round := 0; len(todo) > 0; round++ {
		if round == 5 {
			return nil, fmt.Errorf("queue: enqueue: unique keys kept changing state; gave up after %d rounds", round)
		}
		dups, err := c.insert(ctx, q, ps, todo, results)
		if err != nil {
			return nil, err
		}
		if len(dups) == 0 {
			break
		}
		todo, err = c.resolveDuplicates(ctx, q, ps, dups, results)
		if err != nil {
			return nil, err
		}
	}
	for i, r := range results {
		if !r.Duplicate {
			c.metrics.enqueued.WithLabelValues(ps[i].queue, ps[i].kind).Inc()
		}
	}
	return results, nil
}

// insert runs the enqueue statement for ps[todo...], fills results and returns
// the indexes that conflicted with an unfinished job's unique key.
func (c *Client) insert(ctx context.Context, q querier, ps []prepared, todo []int, results []EnqueueResult) ([]int, error) {
	n := len(todo)
	var rows pgx.Rows
	var err error
	if n == 1 {
		p := ps[todo[0]]
		rows, err = q.Query(ctx, c.sql.enqueueOne, p.queue, p.kind, string(p.payload), p.priority,
			p.runAfter, p.delayMicros, p.maxAttempts, p.uniqueKey, c.channel)
	} else {
		rows, err = c.insertMany(ctx, q, ps, todo)
	}
	if err != nil {
		return nil, fmt.Errorf("queue: enqueue: %w", err)
	}
	return c.matchInserted(rows, ps, todo, results)
}

// insertMany runs the array form of the enqueue statement for ps[todo...].
func (c *Client) insertMany(ctx context.Context, q querier, ps []prepared, todo []int) (pgx.Rows, error) {
	n := len(todo)
	var (
		queues   = make([]string, n)
		kinds    = make([]string, n)
		payloads = make([]string, n)
		prios    = make([]int16, n)
		runAfter = make([]*time.Time, n)
		delays   = make([]int64, n)
		maxAtt   = make([]int32, n)
		keys     = make([]*string, n)
	)
	for k, i := range todo {
		p := ps[i]
		queues[k], kinds[k], payloads[k], prios[k] = p.queue, p.kind, string(p.payload), p.priority
		runAfter[k], delays[k], maxAtt[k], keys[k] = p.runAfter, p.delayMicros, p.maxAttempts, p.uniqueKey
	}
	return q.Query(ctx, c.sql.enqueue, queues, kinds, payloads, prios, runAfter, delays, maxAtt, keys, c.channel)
}

// matchInserted reads the enqueue statement's rows into results and returns
// the indexes that conflicted with an unfinished job's unique key.
func (c *Client) matchInserted(rows pgx.Rows, ps []prepared, todo []int, results []EnqueueResult) ([]int, error) {
	type row struct {
		id  int64
		key *string
	}
	var got []row
	for rows.Next() {
		var r row
		var woke int64
		if err := rows.Scan(&r.id, &r.key, &woke); err != nil {
			rows.Close()
			return nil, fmt.Errorf("queue: enqueue: %w", err)
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("queue: enqueue: %w", err)
	}
	// Inserted rows come back in input order; inputs with a unique key that
	// conflicted are missing from them.
	var dups []int
	g := 0
	for _, i := range todo {
		p := ps[i]
		if g < len(got) && (p.uniqueKey == nil || (got[g].key != nil && *got[g].key == *p.uniqueKey)) {
			results[i] = EnqueueResult{ID: got[g].id}
			g++
			continue
		}
		if p.uniqueKey == nil {
			return nil, fmt.Errorf("queue: enqueue: internal error: returned rows do not match the input")
		}
		dups = append(dups, i)
	}
	if g != len(got) {
		return nil, fmt.Errorf("queue: enqueue: internal error: %d rows returned, %d matched", len(got), g)
	}
	return dups, nil
}

// resolveDuplicates fills in the ids of unfinished jobs holding the keys of
// ps[dups...] and returns the indexes whose holder has finished meanwhile.
func (c *Client) resolveDuplicates(ctx context.Context, q querier, ps []prepared, dups []int, results []EnqueueResult) ([]int, error) {
	keys := make([]string, len(dups))
	for k, i := range dups {
		keys[k] = *ps[i].uniqueKey
	}
	rows, err := q.Query(ctx, c.sql.uniqueHolders, keys)
	if err != nil {
		return nil, fmt.Errorf("queue: enqueue: look up unique keys: %w", err)
	}
	holders := map[string]int64{}
	for rows.Next() {
		var k string
		var id int64
		if err := rows.Scan(&k, &id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("queue: enqueue: look up unique keys: %w", err)
		}
		holders[k] = id
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("queue: enqueue: look up unique keys: %w", err)
	}
	var again []int
	for _, i := range dups {
		if id, ok := holders[*ps[i].uniqueKey]; ok {
			results[i] = EnqueueResult{ID: id, Duplicate: true}
		} else {
			again = append(again, i)
		}
	}
	return again, nil
}

// ErrNotFound is returned by Cancel and Retry when no job matches in the
// required state.
var ErrNotFound = errors.New("queue: no such job in a state that allows this")

// Cancel marks a pending job cancelled (with a cancelled event). A job whose
// handler is running now waits for it: Cancel blocks until that attempt ends,
// then cancels the job only if it is still pending.
func (c *Client) Cancel(ctx context.Context, id int64) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.CancelTx(ctx, tx, id) })
}

// CancelTx is Cancel in the caller's transaction.
func (c *Client) CancelTx(ctx context.Context, tx pgx.Tx, id int64) error {
	var got int64
	err := tx.QueryRow(ctx, c.sql.cancel, id).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: cancel job %d: not pending", ErrNotFound, id)
	}
	if err != nil {
		return fmt.Errorf("queue: cancel job %d: %w", id, err)
	}
	return nil
}

// Retry puts a failed job back to pending, due now, with a retried event and
// a wake-up. Its attempts are kept; max attempts grows by one if needed so it
// runs at least once more.
func (c *Client) Retry(ctx context.Context, id int64) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.RetryTx(ctx, tx, id) })
}

// RetryTx is Retry in the caller's transaction.
func (c *Client) RetryTx(ctx context.Context, tx pgx.Tx, id int64) error {
	var got, woke int64
	err := tx.QueryRow(ctx, c.sql.retry, id, c.channel).Scan(&got, &woke)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: retry job %d: not failed", ErrNotFound, id)
	}
	if err != nil {
		return fmt.Errorf("queue: retry job %d: %w", id, err)
	}
	return nil
}
