package queue

import "github.com/pgwake/pgwake/internal/sqlident"

// periodicStatements are the statements against the periodic and
// paused_queues tables (migration 0012): the store's part for periodic
// schedules (periodic.go) and paused queues (pause.go).
type periodicStatements struct {
	// register creates schedule $1 (spec $2, kind $3, queue $4) or updates
	// its description, keeping its last slot.
	register string
	// read is schedule $1's last slot (NULL: none yet) and the database's
	// clock. Rows: last_slot, clock_timestamp.
	read string
	// advance moves schedule $1's last slot from $2 (NULL: none) to $3.
	// Rows: one when it moved, none when another client moved it first.
	advance string
	// list is every schedule. Rows: name, spec, kind, queue, last_slot,
	// updated_at.
	list string

	// pause marks queue $1 paused and tells every client ($2: channel).
	pause string
	// resume removes queue $1's pause and tells every client ($2: channel).
	// Rows: how many pause rows it removed.
	resume string
	// paused lists the paused queues among $1. Rows: queue.
	paused string
	// queues lists the queues that are paused or have pending jobs. Rows:
	// queue, paused_at (NULL: not paused).
	queues string
}

func newPeriodicStatements(schema string) periodicStatements {
	periodic := sqlident.Quote(schema, "periodic")
	paused := sqlident.Quote(schema, "paused_queues")
	jobs := sqlident.Quote(schema, "jobs")
	return periodicStatements{
		register: `INSERT INTO ` + periodic + ` (name, spec, kind, queue) VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, kind = EXCLUDED.kind, queue = EXCLUDED.queue, updated_at = now()`,
		read: `SELECT last_slot, clock_timestamp() FROM ` + periodic + ` WHERE name = $1`,
		advance: `UPDATE ` + periodic + ` SET last_slot = $3::timestamptz, updated_at = now()
WHERE name = $1 AND last_slot IS NOT DISTINCT FROM $2::timestamptz
RETURNING name`,
		list: `SELECT name, spec, kind, queue, last_slot, updated_at FROM ` + periodic + ` ORDER BY name`,

		pause: `WITH p AS (
	INSERT INTO ` + paused + ` (queue) VALUES ($1) ON CONFLICT (queue) DO NOTHING
)
SELECT pg_catalog.pg_notify($2::text, '` + pausePrefix + `' || $1::text)`,
		resume: `WITH d AS (
	DELETE FROM ` + paused + ` WHERE queue = $1 RETURNING queue
)
SELECT (SELECT count(*) FROM d), pg_catalog.pg_notify($2::text, '` + resumePrefix + `' || $1::text)::text`,
		paused: `SELECT queue FROM ` + paused + ` WHERE queue = ANY($1::text[])`,
		queues: `WITH RECURSIVE pending(queue) AS (
	(SELECT queue FROM ` + jobs + ` WHERE state = 'pending' ORDER BY queue LIMIT 1)
	UNION ALL
	SELECT (SELECT j.queue FROM ` + jobs + ` j WHERE j.state = 'pending' AND j.queue > p.queue ORDER BY j.queue LIMIT 1)
	FROM pending p WHERE p.queue IS NOT NULL
), names AS (
	SELECT queue FROM pending WHERE queue IS NOT NULL
	UNION SELECT queue FROM ` + paused + `
)
SELECT n.queue, p.paused_at FROM names n LEFT JOIN ` + paused + ` p ON p.queue = n.queue ORDER BY n.queue`,
	}
}
