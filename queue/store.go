package queue

import "github.com/pgwake/pgwake/internal/sqlident"

// statements is every statement the queue sends against pgwake's tables,
// with the schema quoted in: the one place their SQL lives. Each is written
// with exact argument types (float8 * interval, numeric * numeric, text ||
// text), so no function or operator a role creates on the search path can
// match better than the built-in one.
type statements struct {
	// enqueue inserts the jobs of unnest($1..$8), their events and one
	// wake-up per queue a worker waits on ($9: the channel). Rows: id,
	// unique_key, wake count; a unique key held by an unfinished job returns
	// no row for that input.
	enqueue string
	// enqueueOne is enqueue for one job without arrays: $1 queue, $2 kind,
	// $3 payload, $4 priority, $5 run_after, $6 delay µs, $7 max attempts,
	// $8 unique key, $9 channel.
	enqueueOne string
	// claim locks due jobs of queue $1 that have no attempt record: up to
	// $2 held jobs ($3: kinds that run alone) or $5 leased ones ($4: leased
	// kinds). Rows: claimCols.
	claim string
	// claimAfter is claim starting after ($6 priority, $7 run_after, $8 id).
	claimAfter string
	// claimOne locks the head due job of queue $1 (no batching). Rows: claimCols.
	claimOne string
	// claimPlain locks up to $2 due jobs of queue $1, when every kind batches
	// (none runs alone, none is leased). Rows: claimCols.
	claimPlain string
	// claimPlainAfter is claimPlain starting after ($3 priority, $4
	// run_after, $5 id).
	claimPlainAfter string
	// claimRecovered locks one pending job of queue $1 whose attempt started
	// and recorded no outcome. Rows: claimCols, then the attempt record's
	// attempt, isolation and client_id.
	claimRecovered string
	// next is the milliseconds until the queue $1's earliest future job.
	next string
	// recordStarts records that attempts of jobs $1 (attempt numbers $3) of
	// queue $2 started in a batch of $4, by client $5, at isolation level $6.
	recordStarts string
	// forgetStarts deletes client $2's attempt records of jobs $1, for jobs
	// that never started after all.
	forgetStarts string
	// succeed marks jobs $1 succeeded (those still pending) and deletes the
	// attempt records of jobs $2. Rows: the ids it marked.
	succeed string
	// fail records a failed attempt of job $1 (attempts $2 at claim): error
	// $3, new state $4 ('pending' or 'failed'), retry after $5 µs, channel $6.
	// Rows: state, ms until the retry, wake count; none when superseded.
	fail string
	// cancel marks pending or running jobs $1 cancelled ($2: channel, to
	// tell a running job's worker). Rows: the ids it cancelled, tell count.
	cancel string
	// startLeased marks leased jobs $1 running with a lease of $2 µs owned
	// by client $3, attempt counted. Rows: the ids it started.
	startLeased string
	// extendLeases extends client $3's leases of jobs $1 by $2 µs. Rows:
	// the ids still leased.
	extendLeases string
	// expiredLeases locks up to 100 running jobs of queues $1 whose lease
	// expired. Rows: id, queue, kind, attempts, max_attempts.
	expiredLeases string
	// succeedLeased marks job $1 (attempts $2) succeeded if client $3 still
	// holds its lease. Rows: its id.
	succeedLeased string
	// failLeased records the failed leased attempt of job $1 (attempts $2,
	// already counted): error $3, state $4, retry after $5 µs, channel $6,
	// owner $7 ('' : an expired lease, rescued). Rows as fail.
	failLeased string
	// retry puts failed job $1 back to pending ($2: channel).
	retry string

	// lostQueues lists the queues with attempt records older than a few
	// seconds (lost, or of long-running attempts).
	lostQueues string

	setWaiter, heartbeat, dropWaiters, pruneWaiters, pruneStarts string
	idleBarrier                                                  string
	uniqueHolders                                                string
	// deleteFinished deletes up to $3 jobs of state $1 that finished more
	// than $2 µs ago.
	deleteFinished string
}

// stateIs is the check that a job found by id is still in state, for the
// statements that move jobs by id. It is written so the planner cannot match
// it to a partial index's predicate (the claim index is WHERE state =
// 'pending', the lease index WHERE state = 'running'): with statistics that
// undercount the table (a new table, a burst after a quiet spell) the plain
// "state = 'pending'" made it scan the whole claim index for the ids instead
// of probing the primary key, 25-45 ms per batch of 32 on 20,000 pending
// jobs (TestByIDStatementsProbeThePrimaryKey).
func stateIs(col, state string) string { return "(" + col + " = '" + state + "') IS TRUE" }

// claimCols are the columns every claim returns, in claimedJob's scan order.
const claimCols = `j.id, j.queue, j.kind, j.payload, j.priority, j.attempts, j.max_attempts, j.run_after, j.created_at,
	coalesce(j.unique_key, ''), coalesce(j.last_error, ''),
	extract(epoch FROM clock_timestamp() - greatest(j.run_after, j.created_at))::float8`

// tables are the quoted names statements are built with.
type tables struct {
	schema, jobs, events, waiters, attempts, wakeNeeded string
}

func newStatements(schema string) statements {
	t := tables{
		schema:     schema,
		jobs:       sqlident.Quote(schema, "jobs"),
		events:     sqlident.Quote(schema, "events"),
		waiters:    sqlident.Quote(schema, "waiters"),
		attempts:   sqlident.Quote(schema, "attempts"),
		wakeNeeded: sqlident.Quote(schema, "wake_needed"),
	}
	var s statements
	s.enqueueStatements(t)
	s.claimStatements(t)
	s.outcomeStatements(t)
	s.leasedStatements(t)
	s.waiterStatements(t)
	s.retentionStatements(t)
	return s
}

// enqueueStatements: jobs and events: enqueue.
func (s *statements) enqueueStatements(t tables) {
	jobs, events, wakeNeeded := t.jobs, t.events, t.wakeNeeded
	// The wake payload: the queue, plus "|<ms>" when its earliest new job is
	// that far in the future (parsed by parseWake).
	enqueueTail := `
	ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('pending', 'running') DO NOTHING
	RETURNING id, queue, kind, run_after, unique_key
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt, data)
	SELECT id, 'enqueued', queue, kind, 0, pg_catalog.jsonb_build_object('run_after', run_after) FROM ins ORDER BY id
), wake AS (
	SELECT pg_catalog.pg_notify($9, queue || CASE WHEN min(run_after) > clock_timestamp()
		THEN '|' || pg_catalog.ceil(extract(epoch FROM min(run_after) - clock_timestamp()) * 1000::numeric)::bigint::text
		ELSE '' END)
	FROM ins GROUP BY queue HAVING ` + wakeNeeded + `(queue)
)
SELECT id, unique_key, (SELECT count(*) FROM wake) FROM ins`
	s.enqueue = `
WITH input AS (
	SELECT * FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::jsonb[]),
		pg_catalog.unnest($4::smallint[]), pg_catalog.unnest($5::timestamptz[]), pg_catalog.unnest($6::float8[]),
		pg_catalog.unnest($7::int[]), pg_catalog.unnest($8::text[]))
		WITH ORDINALITY AS t(queue, kind, payload, priority, run_after, delay_us, max_attempts, unique_key, ord)
), ins AS (
	INSERT INTO ` + jobs + ` (queue, kind, payload, priority, run_after, max_attempts, unique_key)
	SELECT queue, kind, payload, priority, coalesce(run_after, now() + delay_us * interval '1 microsecond'), max_attempts, unique_key
	FROM input ORDER BY ord` + enqueueTail
	s.enqueueOne = `
WITH ins AS (
	INSERT INTO ` + jobs + ` (queue, kind, payload, priority, run_after, max_attempts, unique_key)
	VALUES ($1, $2, $3::jsonb, $4, coalesce($5, now() + $6::float8 * interval '1 microsecond'), $7, $8)` + enqueueTail
	s.uniqueHolders = `SELECT unique_key, id FROM ` + jobs + ` WHERE unique_key = ANY($1::text[]) AND state IN ('pending', 'running')`
}

// claimStatements: jobs and attempts: claims.
func (s *statements) claimStatements(t tables) {
	jobs, attempts := t.jobs, t.attempts
	s.claim = claimBatchSQL(jobs, attempts, "", "")
	s.claimAfter = claimBatchSQL(jobs, attempts, "AND j.priority >= $6::smallint",
		"AND (j.priority, j.run_after, j.id) > ($6::smallint, $7::timestamptz, $8::bigint)")
	s.claimOne = claimPlainSQL(jobs, attempts, "", "", "1")
	s.claimPlain = claimPlainSQL(jobs, attempts, "", "", "$2::int")
	s.claimPlainAfter = claimPlainSQL(jobs, attempts, "AND j.priority >= $3::smallint",
		"AND (j.priority, j.run_after, j.id) > ($3::smallint, $4::timestamptz, $5::bigint)", "$2::int")
	s.claimRecovered = `
SELECT ` + claimCols + `, a.attempt, a.isolation, a.client_id
FROM ` + attempts + ` a JOIN ` + jobs + ` j ON j.id = a.job_id
WHERE a.queue = $1 AND j.queue = $1 AND ` + stateIs("j.state", "pending") + `
ORDER BY a.started_at
LIMIT 1
FOR UPDATE OF j SKIP LOCKED`
	// The claim index is ordered by priority first, so walk the queue's
	// distinct priorities (one index probe each) and take the earliest
	// future run_after of each: a few probes instead of a second index
	// on every enqueue.
	s.next = `
WITH RECURSIVE ` + prioritiesSQL(jobs, "") + `
SELECT extract(epoch FROM min((
	SELECT j.run_after FROM ` + jobs + ` j
	WHERE j.state = 'pending' AND j.queue = $1 AND j.priority = p.priority AND j.run_after > now()
	ORDER BY j.run_after LIMIT 1)) - clock_timestamp())::float8 * 1000::float8
FROM p WHERE p.priority IS NOT NULL`
}

// outcomeStatements: jobs, events and attempts: attempt records and outcomes.
func (s *statements) outcomeStatements(t tables) {
	jobs, events, attempts := t.jobs, t.events, t.attempts
	s.recordStarts = `
INSERT INTO ` + attempts + ` (job_id, queue, attempt, batch, client_id, isolation)
SELECT t.id, $2::text, t.attempt, $4::int, $5::text, $6::smallint FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($3::int[])) AS t(id, attempt)
ON CONFLICT (job_id) DO UPDATE SET attempt = EXCLUDED.attempt, batch = EXCLUDED.batch,
	client_id = EXCLUDED.client_id, isolation = EXCLUDED.isolation, started_at = EXCLUDED.started_at`
	s.forgetStarts = `DELETE FROM ` + attempts + ` WHERE job_id = ANY($1::bigint[]) AND client_id = $2::text`
	s.succeed = `
WITH j AS (
	UPDATE ` + jobs + ` SET state = 'succeeded', attempts = attempts + 1, finished_at = clock_timestamp()
	WHERE id = ANY($1::bigint[]) AND ` + stateIs("state", "pending") + `
	RETURNING id, queue, kind, attempts
), a AS (
	DELETE FROM ` + attempts + ` WHERE job_id = ANY($2::bigint[])
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt)
	SELECT id, 'succeeded', queue, kind, attempts FROM j ORDER BY id
)
SELECT id FROM j`
	s.fail = `
WITH j AS (
	UPDATE ` + jobs + ` SET
		attempts = attempts + 1,
		last_error = $3::text,
		state = $4::text,
		run_after = CASE WHEN $4::text = 'pending' THEN clock_timestamp() + $5::float8 * interval '1 microsecond' ELSE run_after END,
		finished_at = CASE WHEN $4::text = 'failed' THEN clock_timestamp() END
	WHERE id = $1 AND attempts = $2 AND ` + stateIs("state", "pending") + `
	RETURNING id, queue, kind, attempts, state, run_after
), a AS (
	DELETE FROM ` + attempts + ` WHERE job_id IN (SELECT id FROM j)
)` + failedTailSQL(events)
	// A running (leased) job is cancelled too, and its worker told to
	// cancel the handler ("!cancel|<id>": '!' starts no queue name).
	s.cancel = `
WITH j AS (
	UPDATE ` + jobs + ` SET state = 'cancelled', finished_at = clock_timestamp(), lease_expires_at = NULL
	WHERE id = ANY($1::bigint[]) AND state IN ('pending', 'running')
	RETURNING id, queue, kind, attempts, leased_by
), a AS (
	DELETE FROM ` + attempts + ` WHERE job_id IN (SELECT id FROM j)
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt)
	SELECT id, 'cancelled', queue, kind, attempts FROM j ORDER BY id
), tell AS (
	SELECT pg_catalog.pg_notify($2::text, '!cancel|' || id::text) FROM j WHERE leased_by IS NOT NULL
)
SELECT id, (SELECT count(*) FROM tell) FROM j`
	s.retry = `
WITH j AS (
	UPDATE ` + jobs + ` SET state = 'pending', run_after = now(), finished_at = NULL,
		max_attempts = greatest(max_attempts, attempts + 1)
	WHERE id = $1 AND state = 'failed'
	RETURNING id, queue, kind, attempts, run_after
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt, data)
	SELECT id, 'retried', queue, kind, attempts, pg_catalog.jsonb_build_object('run_after', run_after) FROM j
), wake AS (
	SELECT pg_catalog.pg_notify($2, queue) FROM j
)
SELECT id, (SELECT count(*) FROM wake) FROM j`
	// Attempt records whose job finished some other way (cancelled by
	// an operator after its worker died, deleted by hand).
	s.lostQueues = `SELECT DISTINCT queue FROM ` + attempts + ` WHERE started_at < now() - interval '5 seconds'`
	s.pruneStarts = `DELETE FROM ` + attempts + ` a WHERE NOT EXISTS (
	SELECT 1 FROM ` + jobs + ` j WHERE j.id = a.job_id AND ` + stateIs("j.state", "pending") + `)`
}

// leasedStatements: jobs and events: leased mode.
func (s *statements) leasedStatements(t tables) {
	jobs, events := t.jobs, t.events
	s.startLeased = `
WITH j AS (
	UPDATE ` + jobs + ` SET state = 'running', attempts = attempts + 1, leased_by = $3::text,
		lease_expires_at = clock_timestamp() + $2::float8 * interval '1 microsecond'
	WHERE id = ANY($1::bigint[]) AND ` + stateIs("state", "pending") + `
	RETURNING id, queue, kind, attempts
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt)
	SELECT id, 'started', queue, kind, attempts FROM j ORDER BY id
)
SELECT id FROM j`
	s.extendLeases = `
UPDATE ` + jobs + ` SET lease_expires_at = clock_timestamp() + $2::float8 * interval '1 microsecond'
WHERE id = ANY($1::bigint[]) AND ` + stateIs("state", "running") + ` AND leased_by = $3::text
RETURNING id`
	s.expiredLeases = `
SELECT id, queue, kind, attempts, max_attempts FROM ` + jobs + `
WHERE state = 'running' AND queue = ANY($1::text[]) AND lease_expires_at < clock_timestamp()
ORDER BY lease_expires_at
LIMIT 100
FOR UPDATE SKIP LOCKED`
	s.succeedLeased = `
WITH j AS (
	UPDATE ` + jobs + ` SET state = 'succeeded', finished_at = clock_timestamp(), lease_expires_at = NULL, leased_by = NULL
	WHERE id = $1 AND attempts = $2 AND ` + stateIs("state", "running") + ` AND leased_by = $3::text
	RETURNING id, queue, kind, attempts
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt)
	SELECT id, 'succeeded', queue, kind, attempts FROM j
)
SELECT id FROM j`
	s.failLeased = `
WITH j AS (
	UPDATE ` + jobs + ` SET
		last_error = $3::text,
		state = $4::text,
		run_after = CASE WHEN $4::text = 'pending' THEN clock_timestamp() + $5::float8 * interval '1 microsecond' ELSE run_after END,
		finished_at = CASE WHEN $4::text = 'failed' THEN clock_timestamp() END,
		lease_expires_at = NULL, leased_by = NULL
	WHERE id = $1 AND attempts = $2 AND ` + stateIs("state", "running") + `
	  AND CASE WHEN $7::text = '' THEN lease_expires_at < clock_timestamp() ELSE leased_by = $7::text END
	RETURNING id, queue, kind, attempts, state, run_after
)` + failedTailSQL(events)
}

// waiterStatements: waiters: the wake-up protocol.
func (s *statements) waiterStatements(t tables) {
	waiters := t.waiters
	s.setWaiter = `INSERT INTO ` + waiters + ` (queue, client_id, idle) VALUES ($1, $2, $3)
ON CONFLICT (queue, client_id) DO UPDATE SET idle = EXCLUDED.idle, heartbeat_at = now()`
	// A missing row (crash recovery empties the unlogged table) comes
	// back idle: an extra NOTIFY is harmless, a missing one costs latency.
	s.heartbeat = `INSERT INTO ` + waiters + ` (queue, client_id) SELECT pg_catalog.unnest($1::text[]), $2
ON CONFLICT (queue, client_id) DO UPDATE SET heartbeat_at = now()`
	s.dropWaiters = `DELETE FROM ` + waiters + ` WHERE client_id = $1`
	s.pruneWaiters = `DELETE FROM ` + waiters + ` WHERE heartbeat_at < now() - interval '10 minutes'`
	// Tried, never waited for: a waiting exclusive request would stall
	// every producer behind it.
	s.idleBarrier = `SELECT pg_catalog.pg_try_advisory_xact_lock(` + sqlident.Quote(t.schema, "wake_lock_key") + `($1::text))`
}

// retentionStatements: jobs: retention.
func (s *statements) retentionStatements(t tables) {
	jobs := t.jobs
	s.deleteFinished = deleteFinishedSQL(jobs)
}

// claimableSQL is the condition every normal claim puts on a job: pending,
// due, and no attempt record (a job with one is claimed by claimRecovered).
func claimableSQL(attempts string) string {
	return `j.state = 'pending' AND j.queue = $1 AND j.run_after <= now()
	AND NOT EXISTS (SELECT 1 FROM ` + attempts + ` a WHERE a.job_id = j.id)`
}

// prioritiesSQL is the recursive CTE p(priority): the distinct priorities
// of queue $1's pending jobs in ascending order, each found by one probe of
// the claim index, then a NULL row that ends the walk. from bounds the
// first one (the cursor's priority).
//
// The claim index is ordered (queue, priority, run_after, id): a scan
// bounded by the queue alone cannot stop at run_after <= now(), so with
// jobs scheduled ahead it read every one of them (300,000 jobs: about 2,000
// buffers per claim). The claims walk the priorities instead and range-scan
// each one up to now(): a few index pages each, however many jobs wait in
// the future (TestClaimCostIsFlatInFutureJobs).
func prioritiesSQL(jobs, from string) string {
	return `p(priority) AS (
	(SELECT j.priority FROM ` + jobs + ` j WHERE j.state = 'pending' AND j.queue = $1 ` + from + ` ORDER BY j.priority LIMIT 1)
	UNION ALL
	SELECT (SELECT j.priority FROM ` + jobs + ` j
		WHERE j.state = 'pending' AND j.queue = $1 AND j.priority > p.priority ORDER BY j.priority LIMIT 1)
	FROM p WHERE p.priority IS NOT NULL
)`
}

// claimWalkSQL selects cols of up to limit claimable jobs that also meet
// cond (and the cursor condition after), in claim order, and locks them
// (SKIP LOCKED): a nested loop over the priorities of CTE p, one range
// scan of the claim index per priority. The outer LIMIT stops the loop as
// soon as limit rows are locked, so no row is locked that is not returned.
func claimWalkSQL(jobs, attempts, cols, cond, after, limit string) string {
	return `SELECT x.* FROM p, LATERAL (
		SELECT ` + cols + ` FROM ` + jobs + ` j
		WHERE ` + claimableSQL(attempts) + ` AND j.priority = p.priority ` + after + cond + `
		ORDER BY j.run_after, j.id
		LIMIT ` + limit + `
		FOR UPDATE OF j SKIP LOCKED) x
	WHERE p.priority IS NOT NULL
	LIMIT ` + limit
}

// claimPlainSQL locks up to limit due jobs in claim order, after the cursor
// condition after (from: the cursor's bound on the priority walk).
func claimPlainSQL(jobs, attempts, from, after, limit string) string {
	return `
WITH RECURSIVE ` + prioritiesSQL(jobs, from) + `, c AS (
	` + claimWalkSQL(jobs, attempts, claimCols, "", after, limit) + `
)
SELECT * FROM c ORDER BY priority, run_after, id`
}

// claimBatchSQL claims the head job and up to more jobs of the same mode:
// when the head's kind is leased ($4), up to $5 - 1 more leased jobs; when it
// is a held kind not in $3 (kinds that run alone: slow or not yet
// measured), up to $2 - 1 more such jobs; otherwise none. So a slow job
// never holds others of its batch, and a batch is all leased or all held.
// after is the cursor condition, from its bound on the priority walk.
func claimBatchSQL(jobs, attempts, from, after string) string {
	return `
WITH RECURSIVE ` + prioritiesSQL(jobs, from) + `, head AS (
	` + claimWalkSQL(jobs, attempts, `j.id, j.kind, j.kind = ANY($4::text[]) AS leased`, "", after, "1") + `
), rest AS (
	SELECT r.id FROM head h, LATERAL (
	` + claimWalkSQL(jobs, attempts, `j.id`, `
		  AND j.id <> h.id
		  AND CASE WHEN h.leased THEN j.kind = ANY($4::text[])
		      ELSE h.kind <> ALL($3::text[]) AND j.kind <> ALL($3::text[]) AND j.kind <> ALL($4::text[]) END`,
		after, `(SELECT CASE WHEN h.leased THEN $5::int ELSE $2::int END - 1)`) + `) r
)
SELECT ` + claimCols + ` FROM ` + jobs + ` j
WHERE j.id = ANY(ARRAY(SELECT id FROM head UNION ALL SELECT id FROM rest))
ORDER BY j.priority, j.run_after, j.id`
}

// deleteFinishedSQL deletes up to $3 jobs of state $1 that finished more
// than $2 µs ago, oldest first. The range scan of jobs_finished_idx (state,
// finished_at) starts at the state's oldest job and stops at its cutoff, so
// a batch reads what it deletes, not the jobs retention keeps (migration
// 0011). The delete probes the primary key for each id. SKIP LOCKED: a job
// that Retry is putting back to pending right now is not waited for.
func deleteFinishedSQL(jobs string) string {
	return `
DELETE FROM ` + jobs + ` j
WHERE j.id = ANY(ARRAY(
	SELECT id FROM ` + jobs + `
	WHERE state = $1::text AND finished_at < now() - $2::float8 * interval '1 microsecond'
	ORDER BY finished_at
	LIMIT $3::int
	FOR UPDATE SKIP LOCKED))`
}

// failedTailSQL follows a CTE j that moved a job after a failed attempt
// (RETURNING id, queue, kind, attempts, state, run_after): the
// retry_scheduled or failed event, the wake-up for a retry ($6: channel),
// and the row (state, ms until the retry, wake count). $3 is the error.
func failedTailSQL(events string) string {
	return `, ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt, data)
	SELECT id, CASE WHEN state = 'failed' THEN 'failed' ELSE 'retry_scheduled' END, queue, kind, attempts,
		CASE WHEN state = 'failed' THEN pg_catalog.jsonb_build_object('error', $3::text)
		ELSE pg_catalog.jsonb_build_object('error', $3::text, 'run_after', run_after) END
	FROM j
), wake AS (
	SELECT pg_catalog.pg_notify($6, queue || '|' || pg_catalog.ceil(extract(epoch FROM run_after - clock_timestamp()) * 1000::numeric)::bigint::text)
	FROM j WHERE state = 'pending'
)
SELECT state, extract(epoch FROM run_after - clock_timestamp())::float8 * 1000::float8, (SELECT count(*) FROM wake) FROM j`
}
