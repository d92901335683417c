package queue

import "github.com/pgwake/pgwake/internal/sqlident"

// statements is every statement the queue sends against pgwake's tables,
// with the schema quoted in: the one place their SQL lives. Each is written
// with exact argument types (float8 * interval, numeric * numeric, text ||
// text), so no function or operator a role creates on the search path can
// match better than the built-in one.
type statements struct {
	// tbl is the quoted tables, for the statements made per queue
	// (claimFirst).
	tbl tables
	// enqueue calls the SQL API's enqueue_jobs (migrations 0008 and 0014,
	// the one implementation of enqueue): $1 kinds, $2 payloads, $3 queues,
	// $4 run_after, $5 delays, $6 priorities, $7 max attempts, $8 unique
	// keys, $9 unique scopes, $10 unique holds, $11 unique periods, $12
	// metadata (arrays, one element per job; $9-$12 NULL unless a job sets
	// one). Row: the ids,
	// duplicate flags and period ends, in input order.
	enqueue string
	// enqueueOne calls the SQL API's enqueue_one (migration 0021) for one
	// job without a unique key: $1 kind, $2 payload, $3 queue, $4 run_after,
	// $5 delay, $6 priority, $7 max attempts, $8 metadata. Row: the id.
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
	// A plain INSERT: a job claimed as usual has no record of a later
	// attempt, and rarely a stale one (replaceStarts then).
	recordStarts string
	// replaceStarts is recordStarts replacing any record of the jobs: a
	// recovered job's (claimRecovered), or a stale one left by an earlier
	// attempt.
	replaceStarts string
	// forgetStarts deletes client $2's attempt records of jobs $1, for jobs
	// that never started after all.
	forgetStarts string
	// succeed marks jobs $1 succeeded (those still pending) and deletes the
	// attempt records of jobs $2; with $3 its transaction's commit does not
	// wait for the WAL flush (asyncCommit, in the same statement: one
	// statement less a batch). Rows: the ids it marked.
	succeed string
	// fail records a failed attempt of job $1 (attempts $2 at claim): error
	// $3, new state $4 ('pending' or 'failed'), retry after $5 µs, channel $6.
	// Rows: state, ms until the retry, wake count; none when superseded.
	fail string
	// cancel marks pending or running jobs $1 cancelled (the SQL API's
	// cancel_jobs, which also tells a running job's worker). Rows: the ids
	// it cancelled.
	cancel string
	// jobState is job $1's state.
	jobState string
	// notify sends payload $2 on channel $1.
	notify string
	// claimLeased claims and starts, in one statement (no transaction of
	// its own: autocommit), the head due job of queue $1 and up to $5 - 1
	// more leased ones when the head's kind is leased ($4: leased kinds):
	// running, attempt counted, a lease of $2 µs owned by client $3, a
	// started event each. Rows: claimCols (attempts as before the claim)
	// and true; or, when the head is of a held kind, that job's claimCols
	// and false, and nothing was claimed (claim it in a transaction).
	claimLeased string
	// claimLeasedAfter is claimLeased starting after ($6 priority, $7
	// run_after, $8 id).
	claimLeasedAfter string
	// startLeased marks leased jobs $1 running with a lease of $2 µs owned
	// by client $3, attempt counted. Rows: the ids it started.
	startLeased string
	// extendLeases extends client $3's leases of jobs $1 by $2 µs, skipping
	// rows locked by another session. Rows: id, extended (false: locked by
	// another session, still this client's by the statement's snapshot);
	// an id not returned is no longer this client's.
	extendLeases string
	// expiredLeases locks up to 100 running jobs of queues $1 whose lease
	// expired. Rows: id, queue, kind, attempts, max_attempts.
	expiredLeases string
	// succeedLeased marks job $1 (attempts $2) succeeded if client $3 still
	// holds its lease. Rows: its id.
	succeedLeased string
	// leaseHeld: whether job $1 runs under client $2's lease.
	leaseHeld string
	// rowWaiter: whether a session waits for a jobs row backend $1 locked.
	rowWaiter string
	// failLeased records the failed leased attempt of job $1 (attempts $2,
	// already counted): error $3, state $4, retry after $5 µs, channel $6,
	// owner $7 ('' : an expired lease, rescued). Rows as fail.
	failLeased string
	// retry puts failed job $1 back to pending (the SQL API's retry). Row:
	// whether it did.
	retry string

	// lostQueues lists the queues with attempt records older than a few
	// seconds (lost, or of long-running attempts).
	lostQueues string

	setWaiter, heartbeat, dropWaiters, pruneWaiters, pruneStarts string
	idleBarrier                                                  string
	// deleteFinished deletes up to $3 jobs of state $1 that finished more
	// than $2 µs ago.
	deleteFinished string
	// deleteUniquePeriods deletes up to $1 unique_periods rows whose period
	// has passed.
	deleteUniquePeriods string

	// periodic and pause are the statements of periodic schedules and
	// paused queues (store_periodic.go).
	periodic periodicStatements
	// read are the read API's statements (store_read.go).
	read readStatements
	// seed are the bulk writes for benchmarks and tests (store_seed.go).
	seed seedStatements
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
var claimCols = claimColsAt("j.attempts")

// claimColsAt is claimCols with attempts, the attempts before the claim,
// read from the expression attempts.
func claimColsAt(attempts string) string {
	return `j.id, j.queue, j.kind, j.payload, j.priority, ` + attempts + ` AS attempts, j.max_attempts, j.run_after, j.created_at,
	coalesce(j.unique_key, ''), coalesce(j.last_error, ''),
	extract(epoch FROM clock_timestamp() - greatest(j.run_after, j.created_at))::float8, j.metadata::text`
}

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
	s := statements{tbl: t}
	s.enqueueStatements(t)
	s.claimStatements(t)
	s.outcomeStatements(t)
	s.leasedStatements(t)
	s.waiterStatements(t)
	s.retentionStatements(t)
	s.periodic = newPeriodicStatements(schema)
	s.read = newReadStatements(schema)
	s.seed = newSeedStatements(schema)
	return s
}

// enqueueStatements: enqueue, through the SQL API. Exact argument types:
// no overload a role creates elsewhere matches better.
func (s *statements) enqueueStatements(t tables) {
	s.enqueue = `SELECT e.ids, e.duplicates, e.held_until FROM ` + sqlident.Quote(t.schema, "enqueue_jobs") + `($1::text[], $2::jsonb[], $3::text[],
	$4::timestamptz[], $5::interval[], $6::integer[], $7::integer[], $8::text[], NULL::integer, $9::text[], $10::text[], $11::interval[], $12::jsonb[]) e`
	s.enqueueOne = `SELECT ` + sqlident.Quote(t.schema, "enqueue_one") + `($1::text, $2::jsonb, $3::text, $4::timestamptz, $5::interval,
	$6::integer, $7::integer, $8::jsonb, NULL::integer)`
}

// claimPos is a position in claim order (priority, run_after, id), as SQL
// expressions: the claim cursor ($3-$5 or $6-$8) or a claim's head (h).
type claimPos struct{ priority, runAfter, id string }

var (
	cursor3 = claimPos{"$3::smallint", "$4::timestamptz", "$5::bigint"}
	cursor6 = claimPos{"$6::smallint", "$7::timestamptz", "$8::bigint"}
	headPos = claimPos{"h.priority", "h.run_after", "h.id"}
)

// after is the condition that a job sorts after c. The cursor claims bound
// their priority walk's first probe with it.
func (c claimPos) after() string {
	return "AND (j.priority, j.run_after, j.id) > (" + c.priority + ", " + c.runAfter + ", " + c.id + ")"
}

// seek is after with, in a walk's range scan of one priority (p), a bound a
// btree scan can start at: from c's position in c's priority, from the
// first entry in a later one and, with earlier given (the run_after that
// ends the scan at once), past the entries of an earlier one. The cursor
// claims bound their range scans with it, and the walk of the jobs a claim
// takes after its head starts at the head with it (the head's walk implies
// the cursor condition, so it replaces it there), so neither reads the
// index entries before c: mostly jobs that finished since the head was
// last claimed, each a heap visit while it is too recent to be marked dead
// in the index (a probe bounded by the priority alone read 100-200 of them
// per claim in a drain of 10,000 jobs, auto_explain). In the range scan,
// whose index condition has the priority by equality, PostgreSQL 15 starts
// at the priority's first entry when the bound is the row (priority,
// run_after, id) alone. TestCursorClaimsSkipTheJobsBeforeTheCursor,
// TestClaimRestSkipsTheJobsBeforeTheHead.
func (c claimPos) seek(earlier string) string {
	if earlier != "" {
		earlier = `
		      WHEN p.priority < ` + c.priority + ` THEN ` + earlier
	}
	return c.after() + `
		  AND (j.run_after, j.id) >= (CASE WHEN p.priority = ` + c.priority + ` THEN ` + c.runAfter + earlier + ` ELSE '-infinity'::timestamptz END,
		      CASE WHEN p.priority = ` + c.priority + ` THEN ` + c.id + ` ELSE (-9223372036854775807)::bigint - 1::bigint END)`
}

// afterHead is the condition, in the walk of the jobs a claim takes after
// its head h, that a job sorts after the head, starting the scan at the head
// (seek); no job of an earlier priority sorts after it.
var afterHead = "\n\t\t  " + headPos.seek("'infinity'::timestamptz")

// claimStatements: jobs and attempts: claims.
func (s *statements) claimStatements(t tables) {
	jobs, attempts := t.jobs, t.attempts
	s.claim = claimBatchSQL(jobs, attempts, "", "")
	s.claimAfter = claimBatchSQL(jobs, attempts, cursor6.after(), cursor6.seek(""))
	s.claimOne = claimPlainSQL(jobs, attempts, "", "", "1")
	s.claimPlain = claimPlainSQL(jobs, attempts, "", "", "$2::int")
	s.claimPlainAfter = claimPlainSQL(jobs, attempts, cursor3.after(), cursor3.seek(""), "$2::int")
	s.claimRecovered = `
SELECT ` + claimCols + `, a.attempt, a.isolation, a.client_id
FROM ` + attempts + ` a JOIN ` + jobs + ` j ON j.id = a.job_id
WHERE a.queue = $1 AND j.queue = $1 AND ` + stateIs("j.state", "pending") + ` AND a.attempt > j.attempts
	AND j.run_after <= now()
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
	// ON CONFLICT costs a speculative insertion (one more probe of the
	// primary key per job): only the rare replacement pays it.
	s.recordStarts = `
INSERT INTO ` + attempts + ` (job_id, queue, attempt, batch, client_id, isolation)
SELECT t.id, $2::text, t.attempt, $4::int, $5::text, $6::smallint FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($3::int[])) AS t(id, attempt)`
	s.replaceStarts = s.recordStarts + `
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
SELECT id FROM j WHERE ` + planRestoredSQL(probeByIDRestore+`
	OPERATOR(pg_catalog.||) pg_catalog.set_config('synchronous_commit',
		CASE WHEN $3::bool THEN 'off' ELSE pg_catalog.current_setting('synchronous_commit') END, true)`)
	s.fail = `
WITH j AS (
	UPDATE ` + jobs + ` SET
		attempts = attempts + CASE WHEN $7::text = 'snoozed' THEN 0 ELSE 1 END,
		last_error = CASE WHEN $7::text = 'snoozed' THEN last_error ELSE $3::text END,` + failedSetSQL + `
	WHERE id = $1 AND attempts = $2 AND ` + stateIs("state", "pending") + `
	RETURNING id, queue, kind, attempts, state, run_after
), a AS (
	DELETE FROM ` + attempts + ` WHERE job_id IN (SELECT id FROM j)
)` + failedTailSQL(events)
	// A running (leased) job is cancelled too, and its worker told to
	// cancel the handler ("!cancel|<id>": '!' starts no queue name).
	s.cancel = `SELECT c FROM ` + sqlident.Quote(t.schema, "cancel_jobs") + `($1::bigint[]) c`
	s.retry = `SELECT ` + sqlident.Quote(t.schema, "retry") + `($1::bigint)`
	s.jobState = `SELECT state FROM ` + jobs + ` WHERE id = $1`
	s.notify = `SELECT pg_catalog.pg_notify($1::text, $2::text)`
	// Attempt records whose job finished some other way (cancelled by
	// an operator after its worker died, deleted by hand).
	s.lostQueues = `SELECT DISTINCT queue FROM ` + attempts + ` WHERE started_at < now() - interval '5 seconds'`
	s.pruneStarts = `DELETE FROM ` + attempts + ` a WHERE NOT EXISTS (
	SELECT 1 FROM ` + jobs + ` j WHERE j.id = a.job_id AND ` + stateIs("j.state", "pending") + ` AND a.attempt > j.attempts)`
}

// leasedStatements: jobs and events: leased mode.
func (s *statements) leasedStatements(t tables) {
	jobs, events := t.jobs, t.events
	s.claimLeased = claimLeasedSQL(t, "", "")
	s.claimLeasedAfter = claimLeasedSQL(t, cursor6.after(), cursor6.seek(""))
	s.startLeased = `
WITH j AS (
	UPDATE ` + jobs + ` j SET ` + startLeaseSet + `
	WHERE id = ANY($1::bigint[]) AND ` + stateIs("state", "pending") + `
	RETURNING id, queue, kind, attempts
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt)
	SELECT id, 'started', queue, kind, attempts FROM j ORDER BY id
)
SELECT id FROM j`
	// A session holding a tuple lock on jobs while it waits for backend
	// $1: an UPDATE of a row that backend's transaction locked.
	s.rowWaiter = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE l.locktype = 'tuple' AND l.granted
	AND l.relation = '` + jobs + `'::pg_catalog.regclass AND $1::int = ANY (pg_catalog.pg_blocking_pids(l.pid)))`
	s.leaseHeld = `SELECT EXISTS (SELECT 1 FROM ` + jobs + ` WHERE id = $1 AND ` + stateIs("state", "running") + ` AND leased_by = $2::text)`
	// Rows another session has locked (a rescuer between its lock and
	// its commit, paused maybe; an operator's open transaction; this
	// client's own completion about to commit) are skipped, not waited
	// for: waiting stalled the extension of every other lease of the
	// client for as long as that lock was held, and those leases expired
	// and were rescued while their handlers ran
	// (TestLockedLeaseDoesNotStallTheHeartbeat). Such a row still ours by
	// the statement's snapshot is returned with extended false: its
	// handler goes on, and the next extension looks again.
	s.extendLeases = `
WITH mine AS (
	SELECT id FROM ` + jobs + `
	WHERE id = ANY($1::bigint[]) AND ` + stateIs("state", "running") + ` AND leased_by = $3::text
), free AS (
	SELECT id FROM ` + jobs + `
	WHERE id = ANY($1::bigint[]) AND ` + stateIs("state", "running") + ` AND leased_by = $3::text
	FOR UPDATE SKIP LOCKED
), x AS (
	UPDATE ` + jobs + ` j SET lease_expires_at = clock_timestamp() + $2::float8 * interval '1 microsecond'
	FROM free WHERE j.id = free.id
	RETURNING j.id
)
SELECT id, true FROM x
UNION ALL
SELECT id, false FROM mine WHERE id NOT IN (SELECT id FROM x)`
	s.expiredLeases = `
SELECT id, queue, kind, attempts, max_attempts FROM ` + jobs + `
WHERE state = 'running' AND queue = ANY($1::text[]) AND lease_expires_at < clock_timestamp()
ORDER BY lease_expires_at
LIMIT 100
FOR UPDATE SKIP LOCKED`
	s.succeedLeased = `
WITH j AS (
	UPDATE ` + jobs + ` AS j SET state = 'succeeded', finished_at = clock_timestamp(), lease_expires_at = NULL, leased_by = NULL
	FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::int[])) AS t(id, attempts)
	WHERE j.id = t.id AND j.attempts = t.attempts AND ` + stateIs("j.state", "running") + ` AND j.leased_by = $3::text
	RETURNING j.id, j.queue, j.kind, j.attempts
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt)
	SELECT id, 'succeeded', queue, kind, attempts FROM j ORDER BY id
)
SELECT id FROM j WHERE ` + planRestoredSQL(genericPlanRestore)
	s.failLeased = `
WITH j AS (
	UPDATE ` + jobs + ` SET
		attempts = attempts - CASE WHEN $7::text = 'snoozed' THEN 1 ELSE 0 END,
		last_error = CASE WHEN $7::text = 'snoozed' THEN last_error ELSE $3::text END,` + failedSetSQL + `,
		lease_expires_at = NULL, leased_by = NULL
	WHERE id = $1 AND attempts = $2 AND ` + stateIs("state", "running") + `
	  AND CASE WHEN $8::text = '' THEN lease_expires_at < clock_timestamp() ELSE leased_by = $8::text END
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

// retentionStatements: jobs and unique_periods: retention.
func (s *statements) retentionStatements(t tables) {
	jobs := t.jobs
	s.deleteFinished = deleteFinishedSQL(jobs)
	periods := sqlident.Quote(t.schema, "unique_periods")
	s.deleteUniquePeriods = `
DELETE FROM ` + periods + ` u
WHERE u.slot = ANY(ARRAY(
	SELECT slot FROM ` + periods + `
	WHERE held_until < now()
	ORDER BY held_until
	LIMIT $1::int
	FOR UPDATE SKIP LOCKED))`
}

// claimFirst is the claim of a wake-up: it locks queue's first due job in
// claim order when that job is of the queue's most urgent pending priority
// (the usual case: a job was just enqueued into an idle queue), and returns
// no row otherwise, when the walk (claimOne) must look further. It reads the
// head of the claim index for that priority, then range-scans the
// priority up to now(): a few index pages however many jobs wait in the
// future (TestClaimCostIsFlatInFutureJobs).
//
// The queue is in the text as a literal (names are validated: lowercase
// letters, digits, '_', '.', '-'), so the statement has no parameter:
// PostgreSQL plans it once per connection and keeps that plan, with no
// custom plans first and so no genericPlan before it and no setting to put
// back. The walk with those costs about 0.08 ms more on a wake-up's path
// (docs/benchmarks.md). A plan cached while the table was small stays a
// range scan as the table grows (TestClaimFirstPlanStaysARangeScan).
func (s statements) claimFirst(queue string) string {
	q := sqlident.Literal(queue)
	return `
SELECT ` + claimCols + ` FROM ` + s.tbl.jobs + ` j
WHERE j.state = 'pending' AND j.queue = ` + q + ` AND j.run_after <= now()
	AND NOT EXISTS (SELECT 1 FROM ` + s.tbl.attempts + ` a WHERE a.job_id = j.id AND a.attempt > j.attempts)
	AND j.priority = (SELECT h.priority FROM ` + s.tbl.jobs + ` h WHERE h.state = 'pending' AND h.queue = ` + q + ` ORDER BY h.priority LIMIT 1)
ORDER BY j.run_after, j.id
LIMIT 1
FOR UPDATE OF j SKIP LOCKED`
}

// claimableSQL is the condition every normal claim puts on a job: pending,
// due, and no attempt record (a job with one is claimed by claimRecovered).
func claimableSQL(attempts string) string {
	return `j.state = 'pending' AND j.queue = $1 AND j.run_after <= now()
	AND NOT EXISTS (SELECT 1 FROM ` + attempts + ` a WHERE a.job_id = j.id AND a.attempt > j.attempts)`
}

// prioritiesSQL is the recursive CTE p(priority): the distinct priorities
// of queue $1's pending jobs in ascending order, each found by one probe of
// the claim index, then a NULL row that ends the walk. from bounds the
// first one (the cursor condition: the first probe starts at the cursor,
// and finds the priority of the first job after it).
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
	return walkSQL(jobs, claimableSQL(attempts), cols, after+cond, limit)
}

// claimPlainSQL locks up to limit due jobs in claim order, after the cursor
// condition after (from: the cursor's bound on the priority walk).
func claimPlainSQL(jobs, attempts, from, after, limit string) string {
	return `
WITH RECURSIVE ` + prioritiesSQL(jobs, from) + `, c AS (
	` + claimWalkSQL(jobs, attempts, claimCols, "", after, limit) + `
)
SELECT * FROM c WHERE ` + planRestoredSQL(genericPlanRestore) + ` ORDER BY priority, run_after, id`
}

// planRestoredSQL is a condition that runs restore (an expression that puts
// back planner settings changed for one statement's plan and returns text)
// and is true. It names no column, so PostgreSQL evaluates it once, when the
// statement's execution starts (a one-time filter, also when no row comes),
// after the plan was chosen: the statement puts the settings back itself,
// where a statement of its own after it would cost the round trip one more
// statement. TestClaimsUseTheGenericPlan,
// TestPlanSettingsEndWithTheStatement.
func planRestoredSQL(restore string) string { return `(SELECT ` + restore + `) IS NOT NULL` }

// genericPlanRestore puts plan_cache_mode back as genericPlan found it; with no genericPlan earlier in the transaction it sets
// the current value again.
const genericPlanRestore = `pg_catalog.set_config('plan_cache_mode', COALESCE(NULLIF(
	pg_catalog.current_setting('pgwake.plan_saved', true), ''), pg_catalog.current_setting('plan_cache_mode')), true)`

// probeByIDRestore puts enable_seqscan and plan_cache_mode back as probeByID
// found them; with no probeByID earlier in the
// transaction it sets their current values again.
const probeByIDRestore = `pg_catalog.set_config('enable_seqscan', COALESCE(NULLIF(pg_catalog.split_part(
	COALESCE(pg_catalog.current_setting('pgwake.probe_saved', true), ''), ' ', 1), ''), pg_catalog.current_setting('enable_seqscan')), true)
	OPERATOR(pg_catalog.||) pg_catalog.set_config('plan_cache_mode', COALESCE(NULLIF(pg_catalog.split_part(
	COALESCE(pg_catalog.current_setting('pgwake.probe_saved', true), ''), ' ', 2), ''), pg_catalog.current_setting('plan_cache_mode')), true)`

// claimBatchSQL claims the head job and up to more jobs of the same mode:
// when the head's kind is leased ($4), up to $5 - 1 more leased jobs; when it
// is a held kind not in $3 (kinds that run alone: slow or not yet
// measured), up to $2 - 1 more such jobs; otherwise none. So a slow job
// never holds others of its batch, and a batch is all leased or all held.
// after is the cursor condition, from its bound on the priority walk. The
// rest's walk starts after the head (afterHead), as claimLeasedSQL's does:
// a job before the head, locked when the head's walk passed it, is not
// taken even if its lock is released before the rest's walk.
func claimBatchSQL(jobs, attempts, from, after string) string {
	return `
WITH RECURSIVE ` + prioritiesSQL(jobs, from) + `, head AS (
	` + claimWalkSQL(jobs, attempts, `j.id, j.kind, j.priority, j.run_after, j.kind = ANY($4::text[]) AS leased`, "", after, "1") + `
), rest AS (
	SELECT r.id FROM head h, LATERAL (
	` + claimWalkSQL(jobs, attempts, `j.id`, `
		  AND CASE WHEN h.leased THEN j.kind = ANY($4::text[])
		      ELSE h.kind <> ALL($3::text[]) AND j.kind <> ALL($3::text[]) AND j.kind <> ALL($4::text[]) END`,
		afterHead, `(SELECT CASE WHEN h.leased THEN $5::int ELSE $2::int END - 1)`) + `) r
)
SELECT ` + claimCols + ` FROM ` + jobs + ` j
WHERE j.id = ANY(ARRAY(SELECT id FROM head UNION ALL SELECT id FROM rest)) AND ` + planRestoredSQL(genericPlanRestore) + `
ORDER BY j.priority, j.run_after, j.id`
}

// claimLeasedSQL is claimLeased, after the cursor condition after (from:
// its bound on the priority walk). The head is found as claimBatchSQL finds
// it; only when it is leased are it and up to $5 - 1 more leased jobs
// marked running, in the same statement, so a leased claim is one round
// trip and one commit. A held head is returned unlocked (the statement
// commits): its batch needs the claim transaction.
//
// Cheaper per call than claimBatchSQL's shape (pg_stat_statements and
// auto_explain, issue 11):
//   - The rows are started through the ctids the walks locked (a TID scan:
//     no second probe of the primary key; a locked row keeps its ctid until
//     this statement updates it). The head is started on its own (s1,
//     ctid = one value): the planner expects one row and probes it, in a
//     generic plan too. The rest (s2, ctid = ANY, ten rows expected) runs
//     only when there is a rest; its generic plan, cached while the table
//     was small, may scan the table instead, as the primary-key probe of
//     the whole set did for every claim (40 of a one-job claim's 56 buffers
//     in the latency bench). A join on the ctids avoided that for the rest
//     too, but cost more CPU than it saved (about a third more per claim of
//     50 jobs).
//   - The rest's walk starts after the head in the index (afterHead): the
//     head's row and any locked rows before it are not read twice.
//   - A job of a leased kind does not probe the attempts table
//     (leasedClaimableSQL).
func claimLeasedSQL(t tables, from, after string) string {
	jobs := t.jobs
	const cols = `j.id, j.ctid AS tid, j.priority, j.run_after, j.kind = ANY($4::text[]) AS leased`
	return `
WITH RECURSIVE ` + prioritiesSQL(jobs, from) + `, head AS (
	` + walkSQL(jobs, leasedClaimableSQL(t.attempts), cols, after, "1") + `
), rest AS (
	SELECT r.tid FROM head h, LATERAL (
	` + walkSQL(jobs, leasedOnlySQL, `j.ctid AS tid`, `
		  AND h.leased`+afterHead,
		`(SELECT CASE WHEN h.leased THEN $5::int - 1 ELSE 0 END)`) + `) r
), s1 AS (
	` + startLeasedSQL(jobs, `j.ctid = (SELECT tid FROM head WHERE leased)`) + `
), s2 AS (
	` + startLeasedSQL(jobs, `j.ctid = ANY(ARRAY(SELECT tid FROM rest)) AND (SELECT count(*) FROM rest) > 0`) + `
), s AS (
	SELECT * FROM s1 UNION ALL SELECT * FROM s2
), ev AS (
	INSERT INTO ` + t.events + ` (job_id, type, queue, kind, attempt)
	SELECT id, 'started', queue, kind, attempts + 1 FROM s ORDER BY id
)
SELECT * FROM s
UNION ALL
SELECT ` + claimCols + `, false FROM ` + jobs + ` j WHERE j.id = (SELECT id FROM head WHERE NOT leased)
ORDER BY priority, run_after, id`
}

// startLeaseSet starts a pending job (aliased j) under a lease of $2 µs
// owned by client $3, attempt counted: the SET of every leased start.
const startLeaseSet = `state = 'running', attempts = j.attempts + 1, leased_by = $3::text,
		lease_expires_at = clock_timestamp() + $2::float8 * interval '1 microsecond'`

// startLeasedSQL marks the pending jobs that meet cond running under a
// lease of $2 µs owned by $3, and returns them as claimLeasedSQL does.
func startLeasedSQL(jobs, cond string) string {
	return `UPDATE ` + jobs + ` j SET ` + startLeaseSet + `
	WHERE ` + cond + ` AND ` + stateIs("j.state", "pending") + `
	RETURNING ` + claimColsAt("j.attempts - 1") + `, true AS started`
}

// walkSQL is claimWalkSQL with the claim condition claimable and the
// conditions cond (the cursor's among them).
func walkSQL(jobs, claimable, cols, cond, limit string) string {
	return `SELECT x.* FROM p, LATERAL (
		SELECT ` + cols + ` FROM ` + jobs + ` j
		WHERE ` + claimable + ` AND j.priority = p.priority ` + cond + `
		ORDER BY j.run_after, j.id
		LIMIT ` + limit + `
		FOR UPDATE OF j SKIP LOCKED) x
	WHERE p.priority IS NOT NULL
	LIMIT ` + limit
}

// leasedOnlySQL is the claim condition of the jobs a leased claim takes
// after its head: due jobs of leased kinds ($4), whatever attempt record
// they have (see leasedClaimableSQL).
const leasedOnlySQL = `j.state = 'pending' AND j.queue = $1 AND j.run_after <= now() AND j.kind = ANY($4::text[])`

// leasedClaimableSQL is claimableSQL for the leased claim: a job of a
// leased kind ($4) is claimable whatever attempt record it has. Leased
// claims write no attempt records (the claim counts the attempt), so such a
// record can only be left by a client that ran the kind in held mode and
// lost the attempt; the leased claim counts a new attempt, and the record,
// now stale (its attempt is not above the job's), is pruned. Only jobs of
// held kinds probe the attempts table (the OR is evaluated left to right).
func leasedClaimableSQL(attempts string) string {
	return `j.state = 'pending' AND j.queue = $1 AND j.run_after <= now()
	AND (j.kind = ANY($4::text[]) OR NOT EXISTS (SELECT 1 FROM ` + attempts + ` a WHERE a.job_id = j.id AND a.attempt > j.attempts))`
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

// failedSetSQL sets the state a failed attempt leads to ($4: pending,
// failed or cancelled), due after $5 µs when pending.
const failedSetSQL = `
		state = $4::text,
		run_after = CASE WHEN $4::text = 'pending' THEN clock_timestamp() + $5::float8 * interval '1 microsecond' ELSE run_after END,
		finished_at = CASE WHEN $4::text IN ('failed', 'cancelled') THEN clock_timestamp() END`

// failedTailSQL follows a CTE j that moved a job after a failed attempt
// (RETURNING id, queue, kind, attempts, state, run_after): the event $7
// (retry_scheduled, failed, cancelled or snoozed), the wake-up for a retry
// ($6: channel), and the row (state, ms until the retry, wake count). $3 is
// the error.
func failedTailSQL(events string) string {
	return `, ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt, data)
	SELECT id, $7::text, queue, kind, attempts,
		CASE WHEN $7::text = 'snoozed' THEN pg_catalog.jsonb_build_object('run_after', run_after)
		WHEN state = 'pending' THEN pg_catalog.jsonb_build_object('error', $3::text, 'run_after', run_after)
		ELSE pg_catalog.jsonb_build_object('error', $3::text) END
	FROM j
), wake AS (
	SELECT pg_catalog.pg_notify($6, queue || '|' || pg_catalog.ceil(extract(epoch FROM run_after - clock_timestamp()) * 1000::numeric)::bigint::text)
	FROM j WHERE state = 'pending'
)
SELECT state, extract(epoch FROM run_after - clock_timestamp())::float8 * 1000::float8, (SELECT count(*) FROM wake) FROM j`
}
