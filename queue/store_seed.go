package queue

import "github.com/pgwake/pgwake/internal/sqlident"

// seedStatements are the statements of SeedFinished and VacuumAnalyze
// (seed.go): bulk writes for benchmarks and tests, never on a worker's path.
type seedStatements struct {
	// jobs writes $4 jobs of queue $1, kind $2, finished in state $3 after
	// one attempt: job i (from 0) finished at $5 minus (i mod $7) × $6 µs,
	// was created and due a minute before, with last error $8 (NULL: none)
	// and payload {"seq": -(i+1)} when $9 (else {}). Events: $10 = 0 none,
	// 1 the final event (data {"error": $8} when $8 is set), 2 enqueued and
	// final. Row: the jobs written.
	jobs string
	// events writes only the final events, of jobs -1..-$4 that have no row
	// (as retention leaves them): $1-$8 as for jobs. Row: the events
	// written.
	events string
	// vacuum* run VACUUM ANALYZE on the jobs and events tables.
	vacuumJobs, vacuumEvents string
}

// seedFinishedAt is when job i of a seed finished.
const seedFinishedAt = `$5::timestamptz - (i % $7::int)::float8 * $6::float8 * interval '1 microsecond'`

func newSeedStatements(schema string) seedStatements {
	jobs := sqlident.Quote(schema, "jobs")
	events := sqlident.Quote(schema, "events")
	return seedStatements{
		jobs: `
WITH g AS (
	SELECT i, ` + seedFinishedAt + ` AS fin FROM pg_catalog.generate_series(0, $4::int - 1) i
), j AS (
	INSERT INTO ` + jobs + ` (queue, kind, payload, state, attempts, last_error, run_after, created_at, finished_at)
	SELECT $1::text, $2::text,
		CASE WHEN $9::bool THEN pg_catalog.jsonb_build_object('seq', -(i + 1)) ELSE '{}'::jsonb END,
		$3::text, 1, $8::text, fin - interval '1 minute', fin - interval '1 minute', fin
	FROM g ORDER BY i
	RETURNING id, queue, kind, state, run_after, finished_at, last_error
), ev AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt, at, data)
	SELECT id, 'enqueued', queue, kind, 0, run_after, pg_catalog.jsonb_build_object('run_after', run_after)
	FROM j WHERE $10::int >= 2
	UNION ALL
	SELECT id, state, queue, kind, 1, finished_at,
		CASE WHEN last_error IS NULL THEN '{}'::jsonb ELSE pg_catalog.jsonb_build_object('error', last_error) END
	FROM j WHERE $10::int >= 1
)
SELECT count(*) FROM j`,
		events: `
WITH e AS (
	INSERT INTO ` + events + ` (job_id, type, queue, kind, attempt, at, data)
	SELECT -(i + 1), $3::text, $1::text, $2::text, 1, ` + seedFinishedAt + `,
		CASE WHEN $8::text IS NULL THEN '{}'::jsonb ELSE pg_catalog.jsonb_build_object('error', $8::text) END
	FROM pg_catalog.generate_series(0, $4::int - 1) i
	RETURNING 1
)
SELECT count(*) FROM e`,
		vacuumJobs:   `VACUUM ANALYZE ` + jobs,
		vacuumEvents: `VACUUM ANALYZE ` + events,
	}
}
