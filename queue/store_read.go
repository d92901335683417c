package queue

import "github.com/pgwake/pgwake/internal/sqlident"

// readStatements are the read API's statements (read.go): the one place the
// SQL of inspecting jobs, events and queues lives.
type readStatements struct {
	// jobGet is job $1. Rows: jobCols, then payload.
	jobGet string
	// jobList is up to $8 jobs, newest first, with id below $7 (0: no
	// cursor), state $1, queue $2, kind $3 ('' : any), created in
	// [$4, $5) (NULL: open), last error containing $6 ignoring case ('':
	// any), payload containing $9 (jsonb @>; NULL: any). Rows: jobCols,
	// then the payload when $10 (else NULL).
	jobList string
	// jobEvents is job $1's events in id order. Rows: eventCols.
	jobEvents string
	// jobEventsTail is job $1's newest $2 events in id order.
	jobEventsTail string
	// eventsAfter is up to $2 events with id above $1, in id order. Rows:
	// eventCols.
	eventsAfter string
	// eventsByID is the events with ids among $1, in id order. Rows:
	// eventCols.
	eventsByID string
	// lastEventID is the highest event id (0: none).
	lastEventID string
	// eventsPrunedThrough is the highest event id pruned (0: none).
	eventsPrunedThrough string
	// eventCount counts the events with id above $1.
	eventCount string
	// stats counts each queue's jobs, every count capped at $1 rows. Rows:
	// queue, pending (due, including held attempts in flight), scheduled,
	// running leased, held attempts in flight, failed, succeeded in the last
	// minute, seconds since the oldest due job's run_after (NULL: none
	// due), paused.
	stats string
	// statsNoSucceeded is stats without the count of recently succeeded
	// jobs (always 0), and without the queues that only such jobs list.
	statsNoSucceeded string
	// eventsPerSecond counts the events of type $1 written at or after $2
	// with id at most $3, per queue and whole second of their time. Rows:
	// queue, second (unix), count.
	eventsPerSecond string
	// estimate* are the planner's row estimates for queue $1's pending due,
	// pending scheduled, failed and recently succeeded jobs, for counts
	// above the exact limit: EXPLAIN of the matching query.
	estimatePending, estimateScheduled, estimateFailed, estimateSucceeded string
	// watch upserts watcher $1's heartbeat (migration 0015): while any
	// watcher's heartbeat is recent, transactions that write events NOTIFY
	// the events channel at commit, at most once per 25 ms (0017).
	watch string
	// unwatch deletes watcher $1.
	unwatch string
}

// jobCols are the columns of a JobInfo, in scanJobInfo's order, from the
// jobs table (unaliased); periods is the unique_periods table.
// A job without a unique key has no scope or hold; with one, NULL columns
// are the defaults (kind, active). A job whose key is held for a period
// has the end of that period while its slot's row (migration 0014, built
// as enqueue_jobs builds it) is still its own: NULL once retention deleted
// the row or a later job took the slot.
func jobCols(periods string) string {
	return `id, queue, kind, state, priority, attempts, max_attempts, run_after, created_at, finished_at,
	coalesce(unique_key, ''),
	CASE WHEN unique_key IS NULL THEN '' ELSE coalesce(unique_scope, 'kind') END,
	CASE WHEN unique_key IS NULL THEN '' ELSE coalesce(unique_hold, 'active') END,
	coalesce(last_error, ''), metadata::text,
	CASE WHEN unique_hold = 'period' AND unique_key IS NOT NULL THEN (SELECT p.held_until FROM ` + periods + ` AS p
		WHERE p.job_id = jobs.id AND p.slot = CASE WHEN jobs.unique_scope = 'queue' THEN 'queue' || chr(31) || jobs.queue
			ELSE 'kind' || chr(31) || jobs.kind END || chr(31) || jobs.unique_key) END`
}

// eventCols are the columns of an EventInfo, in scanEventInfo's order.
const eventCols = `id, job_id, type, queue, kind, attempt, at, data`

func newReadStatements(schema string) readStatements {
	jobs := sqlident.Quote(schema, "jobs")
	events := sqlident.Quote(schema, "events")
	attempts := sqlident.Quote(schema, "attempts")
	paused := sqlident.Quote(schema, "paused_queues")
	watchers := sqlident.Quote(schema, "event_watchers")
	cols := jobCols(sqlident.Quote(schema, "unique_periods"))
	pendingDue := `SELECT 1 FROM ` + jobs + ` WHERE state = 'pending' AND queue = $1::text AND run_after <= now()`
	pendingLater := `SELECT 1 FROM ` + jobs + ` WHERE state = 'pending' AND queue = $1::text AND run_after > now()`
	failed := `SELECT 1 FROM ` + jobs + ` WHERE state = 'failed' AND queue = $1::text`
	succeeded := `SELECT 1 FROM ` + jobs + ` WHERE state = 'succeeded' AND finished_at > now() - interval '1 minute' AND queue = $1::text`
	return readStatements{
		jobGet: `SELECT ` + cols + `, payload FROM ` + jobs + ` WHERE id = $1::bigint`,
		jobList: `SELECT ` + cols + `, CASE WHEN $10::bool THEN payload END FROM ` + jobs + `
WHERE ($1::text = '' OR state = $1::text) AND ($2::text = '' OR queue = $2::text) AND ($3::text = '' OR kind = $3::text)
	AND ($4::timestamptz IS NULL OR created_at >= $4::timestamptz) AND ($5::timestamptz IS NULL OR created_at < $5::timestamptz)
	AND ($6::text = '' OR pg_catalog.strpos(pg_catalog.lower(coalesce(last_error, '')), pg_catalog.lower($6::text)) > 0)
	AND ($7::bigint = 0 OR id < $7::bigint) AND ($9::jsonb IS NULL OR payload @> $9::jsonb)
ORDER BY id DESC LIMIT $8::int`,
		jobEvents: `SELECT ` + eventCols + ` FROM ` + events + ` WHERE job_id = $1::bigint ORDER BY id`,
		jobEventsTail: `SELECT ` + eventCols + ` FROM (SELECT ` + eventCols + ` FROM ` + events + `
	WHERE job_id = $1::bigint ORDER BY id DESC LIMIT $2::int) e ORDER BY id`,
		eventsAfter:         `SELECT ` + eventCols + ` FROM ` + events + ` WHERE id > $1::bigint ORDER BY id LIMIT $2::int`,
		eventsByID:          `SELECT ` + eventCols + ` FROM ` + events + ` WHERE id = ANY($1::bigint[]) ORDER BY id`,
		lastEventID:         `SELECT coalesce(max(id), 0) FROM ` + events,
		eventsPrunedThrough: `SELECT coalesce((SELECT through FROM ` + sqlident.Quote(schema, "events_pruned") + `), 0)`,
		eventCount:          `SELECT count(*) FROM ` + events + ` WHERE id > $1::bigint`,
		stats:               statsSQL(jobs, attempts, paused, true),
		eventsPerSecond: `SELECT queue, pg_catalog.floor(extract(epoch FROM at))::bigint, count(*) FROM ` + events + `
WHERE type = $1::text AND at >= $2::timestamptz AND id <= $3::bigint GROUP BY 1, 2`,
		statsNoSucceeded: statsSQL(jobs, attempts, paused, false),

		estimatePending:   `EXPLAIN (FORMAT JSON) ` + pendingDue,
		estimateScheduled: `EXPLAIN (FORMAT JSON) ` + pendingLater,
		estimateFailed:    `EXPLAIN (FORMAT JSON) ` + failed,
		estimateSucceeded: `EXPLAIN (FORMAT JSON) ` + succeeded,

		watch: `INSERT INTO ` + watchers + ` (id) VALUES ($1::text)
ON CONFLICT (id) DO UPDATE SET seen_at = clock_timestamp()`,
		unwatch: `DELETE FROM ` + watchers + ` WHERE id = $1::text`,
	}
}

// statsSQL counts per queue without reading every pending row: the pending
// (queue, priority) pairs are found by a loose scan of the claim index, and
// each pair's due and scheduled jobs are two ranges of that index
// (queue, priority, run_after), counted up to $1 rows each (due: $1 plus
// the queue's held attempts, which it holds and Running counts). The
// oldest due job is the first entry of each pair's range not held by an
// attempt in flight. Failed jobs: a loose scan of
// the failed index, counted up to $1 per queue; recently succeeded ones: a
// range of the finished index, up to $1 rows (left out without
// succeeded). Running: the leased jobs (lease index) and the attempt
// records of held claims.
func statsSQL(jobs, attempts, paused string, succeeded bool) string {
	recent := ""
	if succeeded {
		recent = `
	UNION ALL
	SELECT queue, 0, 0, 0, 0, 0, count(*), NULL FROM (SELECT queue FROM ` + jobs + `
		WHERE state = 'succeeded' AND finished_at > now() - interval '1 minute' LIMIT $1::int) s GROUP BY queue`
	}
	return `
WITH RECURSIVE qp AS (
	(SELECT queue, priority FROM ` + jobs + ` WHERE state = 'pending' ORDER BY queue, priority LIMIT 1)
	UNION ALL
	SELECT n.queue, n.priority FROM qp, LATERAL (
		SELECT j.queue, j.priority FROM ` + jobs + ` j
		WHERE j.state = 'pending' AND (j.queue, j.priority) > (qp.queue, qp.priority)
		ORDER BY j.queue, j.priority LIMIT 1) n
), pend AS (
	SELECT qp.queue,
		(SELECT count(*) FROM (SELECT 1 FROM ` + jobs + ` j WHERE j.state = 'pending' AND j.queue = qp.queue
			AND j.priority = qp.priority AND j.run_after <= now()
			LIMIT $1::int + (SELECT count(*) FROM ` + attempts + ` a WHERE a.queue = qp.queue)::int) c) AS due,
		(SELECT count(*) FROM (SELECT 1 FROM ` + jobs + ` j WHERE j.state = 'pending' AND j.queue = qp.queue
			AND j.priority = qp.priority AND j.run_after > now() LIMIT $1::int) c) AS later,
		(SELECT j.run_after FROM ` + jobs + ` j WHERE j.state = 'pending' AND j.queue = qp.queue
			AND j.priority = qp.priority
			AND NOT EXISTS (SELECT 1 FROM ` + attempts + ` a WHERE a.job_id = j.id)
			ORDER BY j.run_after LIMIT 1) AS first_run
	FROM qp
), fq AS (
	(SELECT queue FROM ` + jobs + ` WHERE state = 'failed' ORDER BY queue LIMIT 1)
	UNION ALL
	SELECT (SELECT j.queue FROM ` + jobs + ` j WHERE j.state = 'failed' AND j.queue > fq.queue ORDER BY j.queue LIMIT 1)
	FROM fq WHERE fq.queue IS NOT NULL
), agg AS (
	SELECT queue, due, later, 0::bigint AS leased, 0::bigint AS held, 0::bigint AS failed, 0::bigint AS succeeded,
		CASE WHEN first_run <= now() THEN first_run END AS oldest
	FROM pend
	UNION ALL
	SELECT queue, 0, 0, count(*), 0, 0, 0, NULL FROM ` + jobs + ` WHERE state = 'running' GROUP BY queue
	UNION ALL
	SELECT queue, 0, 0, 0, count(*), 0, 0, NULL FROM ` + attempts + ` GROUP BY queue
	UNION ALL
	SELECT fq.queue, 0, 0, 0, 0, (SELECT count(*) FROM (SELECT 1 FROM ` + jobs + ` j
		WHERE j.state = 'failed' AND j.queue = fq.queue LIMIT $1::int) c), 0, NULL
	FROM fq WHERE fq.queue IS NOT NULL` + recent + `
	UNION ALL
	SELECT queue, 0, 0, 0, 0, 0, 0, NULL FROM ` + paused + `
)
SELECT a.queue, sum(a.due)::bigint, sum(a.later)::bigint, sum(a.leased)::bigint, sum(a.held)::bigint,
	sum(a.failed)::bigint, sum(a.succeeded)::bigint,
	extract(epoch FROM now() - min(a.oldest))::float8,
	EXISTS (SELECT 1 FROM ` + paused + ` p WHERE p.queue = a.queue)
FROM agg a GROUP BY a.queue ORDER BY a.queue`
}
