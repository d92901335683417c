package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// SlotInfo describes a logical replication slot.
type SlotInfo struct {
	// Name, Plugin and Database of the slot.
	Name, Plugin, Database string
	// Temporary slots vanish with their connection.
	Temporary bool
	// Active is true while a consumer is connected; ActivePID is its
	// walsender's process id.
	Active    bool
	ActivePID int
	// ConfirmedFlush is where the slot resumes: everything committed before
	// it was acknowledged.
	ConfirmedFlush pglogrepl.LSN
	// LagBytes is the WAL the slot retains beyond ConfirmedFlush
	// (pg_current_wal_lsn() - confirmed_flush_lsn).
	LagBytes int64
	// WALStatus is pg_replication_slots.wal_status (reserved, extended,
	// unreserved, lost).
	WALStatus string
}

const slotQuery = `
SELECT slot_name, coalesce(plugin, ''), coalesce(database, ''), temporary, active, coalesce(active_pid, 0),
	coalesce(confirmed_flush_lsn::text, '0/0'),
	coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint,
	coalesce(wal_status, '')
FROM pg_replication_slots WHERE slot_type = 'logical'`

func scanSlot(row pgx.Row) (*SlotInfo, error) {
	var si SlotInfo
	var lsn string
	if err := row.Scan(&si.Name, &si.Plugin, &si.Database, &si.Temporary, &si.Active, &si.ActivePID, &lsn, &si.LagBytes, &si.WALStatus); err != nil {
		return nil, err
	}
	var err error
	if si.ConfirmedFlush, err = pglogrepl.ParseLSN(lsn); err != nil {
		return nil, fmt.Errorf("events: slot %s: confirmed_flush_lsn %q: %w", si.Name, lsn, err)
	}
	return &si, nil
}

// slotInfo returns the named slot, nil if there is none.
func slotInfo(ctx context.Context, pool *pgxpool.Pool, slot string) (*SlotInfo, error) {
	si, err := scanSlot(pool.QueryRow(ctx, slotQuery+` AND slot_name = $1`, slot))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("events: looking up slot %s: %w", slot, err)
	}
	return si, nil
}

// Slots lists the logical replication slots of the server, by name.
func Slots(ctx context.Context, pool *pgxpool.Pool) ([]SlotInfo, error) {
	rows, err := pool.Query(ctx, slotQuery+` ORDER BY slot_name`)
	if err != nil {
		return nil, fmt.Errorf("events: listing slots: %w", err)
	}
	defer rows.Close()
	var out []SlotInfo
	for rows.Next() {
		si, err := scanSlot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *si)
	}
	return out, rows.Err()
}

// ErrSlotNotFound is returned by DropSlot for a slot that does not exist.
var ErrSlotNotFound = errors.New("replication slot not found")

// ErrSlotActive is returned by DropSlot for a slot a consumer is using.
var ErrSlotActive = errors.New("replication slot is in use")

// DropSlot drops a replication slot of pool's database, releasing the WAL
// it retains; a slot of another database of the cluster is refused
// (ErrSlot). A slot in use by a running stream is refused (ErrSlotActive)
// unless terminate is set, which ends the consumer's walsender first. After a drop, a stream
// with that slot name starts over at the current WAL position: events
// committed meanwhile are not streamed (Read them from the table).
func DropSlot(ctx context.Context, pool *pgxpool.Pool, slot string, terminate bool) error {
	if err := ValidateSlotName(slot); err != nil {
		return err
	}
	si, err := slotInfo(ctx, pool, slot)
	if err != nil {
		return err
	}
	if si == nil {
		return fmt.Errorf("events: %w: %q", ErrSlotNotFound, slot)
	}
	// Slots are the cluster's: a slot of another database (the same
	// default name, "<schema>_events", in two databases) is that
	// database's stream, not ours to drop (TestSlotOfAnotherDatabaseIsLeftAlone).
	var db string
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.current_database()::text`).Scan(&db); err != nil {
		return fmt.Errorf("events: looking up the database: %w", err)
	}
	if si.Database != db {
		return fmt.Errorf("events: %w: slot %q belongs to database %q, not %q; drop it connected to that database", ErrSlot, slot, si.Database, db)
	}
	if si.Active && !terminate {
		return fmt.Errorf("events: %w: %q by walsender pid %d; stop its consumer first (or terminate it)", ErrSlotActive, slot, si.ActivePID)
	}
	for attempt := 0; ; attempt++ {
		if terminate {
			if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot); err != nil {
				return fmt.Errorf("events: terminating the consumer of slot %s: %w", slot, err)
			}
		}
		_, err = pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &pgErr) && pgErr.Code == "42704":
			return nil // dropped meanwhile (a temporary slot, or someone else)
		case errors.As(err, &pgErr) && pgErr.Code == "55006" && terminate && attempt < 50:
			select { // the terminated walsender is still exiting
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		case errors.As(err, &pgErr) && pgErr.Code == "55006":
			return fmt.Errorf("events: %w: %q: %v", ErrSlotActive, slot, err)
		default:
			return fmt.Errorf("events: dropping slot %s: %w", slot, err)
		}
	}
}

// DropPublication drops a publication if it exists.
func DropPublication(ctx context.Context, pool *pgxpool.Pool, publication string) error {
	if err := sqlident.Validate("publication name", publication, 0); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if _, err := pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+sqlident.Quote(publication)); err != nil {
		return fmt.Errorf("events: dropping publication %s: %w", publication, err)
	}
	return nil
}

// lagAge is how long ago the transaction being published committed, 0
// when nothing is pending.
func (s *Stream) lagAge() time.Duration {
	since := s.pendingSince.Load()
	if since == 0 {
		return 0
	}
	return max(time.Since(time.Unix(0, since)), 0)
}

// lagScrapeTimeout bounds the query a scrape of the lag gauge runs.
const lagScrapeTimeout = 2 * time.Second

// measureLag reads the slot's retained WAL and remembers it.
func (s *Stream) measureLag(ctx context.Context) (*SlotInfo, error) {
	si, err := slotInfo(ctx, s.pool, s.cfg.Slot)
	if err != nil || si == nil {
		return nil, err
	}
	s.lagBytes.Store(si.LagBytes)
	return si, nil
}

// scrapeLagBytes measures the slot's lag when the gauge is scraped; when
// the database does not answer in time it reports the last measurement.
func (s *Stream) scrapeLagBytes() float64 {
	ctx, cancel := context.WithTimeout(context.Background(), lagScrapeTimeout)
	defer cancel()
	_, _ = s.measureLag(ctx)
	return float64(s.lagBytes.Load())
}

// lagLoop measures the slot's lag every LagInterval and warns past the
// configured limits. The gauges measure on their own when scraped.
func (s *Stream) lagLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.LagInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if age := s.lagAge(); s.cfg.LagWarnAge > 0 && age > s.cfg.LagWarnAge {
			s.log.Warn("event stream is behind", zap.String("slot", s.cfg.Slot), zap.Duration("age", age))
		}
		si, err := s.measureLag(ctx)
		if err != nil || si == nil {
			continue
		}
		if s.cfg.LagWarnBytes > 0 && si.LagBytes > s.cfg.LagWarnBytes {
			s.log.Warn("replication slot retains much WAL", zap.String("slot", s.cfg.Slot), zap.Int64("lag_bytes", si.LagBytes),
				zap.String("wal_status", si.WALStatus))
		}
	}
}

// DefaultPruneBatch is DeleteBefore's batch when none is given.
const DefaultPruneBatch = 10000

// DeleteBefore deletes the events older than cutoff whose job finished
// before cutoff or no longer exists, and returns how many it deleted.
// Events of unfinished jobs are kept, so Verify still holds for every job
// whose history is complete. It records the highest id it deleted
// (queue.Client.EventsPrunedThrough), so that readers resuming after an
// older id learn that they may have missed events.
//
// It walks the log in id order, batch events (default DefaultPruneBatch) per
// statement, each statement deleting what qualifies in its window and
// probing the job of each old event by primary key, so a statement's cost
// does not depend on the log's size. The log is appended in time order: it
// stops after the first window that holds an event at or after cutoff. A
// window the server cancels (a role's statement_timeout) is retried at half
// its size, down to one event, and the size grows back after each window.
func DeleteBefore(ctx context.Context, pool *pgxpool.Pool, schema string, cutoff time.Time, batch int) (int64, error) {
	if err := migrations.ValidateSchema(schema); err != nil {
		return 0, err
	}
	if batch <= 0 {
		batch = DefaultPruneBatch
	}
	q := deleteBeforeSQL(sqlident.Quote(schema, "events"), sqlident.Quote(schema, "jobs"), sqlident.Quote(schema, "events_pruned"))
	var total, after int64
	size := batch
	for {
		var last *int64
		var deleted int64
		var done bool
		if err := pool.QueryRow(ctx, q, cutoff, after, size).Scan(&last, &deleted, &done); err != nil {
			var pe *pgconn.PgError
			if ctx.Err() == nil && size > 1 && errors.As(err, &pe) && pe.Code == "57014" {
				// Cancelled by the server (a role's statement_timeout):
				// the same window at half the size, as jobs retention does
				// (TestDeleteBeforeUnderAStatementTimeout).
				size /= 2
				continue
			}
			return total, fmt.Errorf("events: retention delete: %w", err)
		}
		total += deleted
		if last == nil || done {
			return total, nil
		}
		after = *last
		size = min(size*2, batch) // grows back after a window that passed
	}
}

// deleteBeforeSQL deletes, among the $3 events after id $2, those older
// than $1 whose job finished before $1 or is gone, and raises the pruned
// watermark (migration 0025) to the highest id it deleted, in the same
// statement. Rows: the window's last id (NULL: the log ends), how many it
// deleted, and whether the window reached an event at or after $1. The job
// is looked up by a scalar subquery, one primary-key probe per old event: a
// join let the planner hash all of jobs, and the old ORDER BY at (a BRIN
// index) sorted the whole log for every batch.
func deleteBeforeSQL(events, jobs, pruned string) string {
	return `
WITH w AS (
	SELECT e.id, e.at,
		CASE WHEN e.at < $1 THEN
			(SELECT j.finished_at IS NULL OR j.finished_at >= $1 FROM ` + jobs + ` j WHERE j.id = e.job_id)
		END AS keep
	FROM ` + events + ` e
	WHERE e.id > $2::bigint
	ORDER BY e.id
	LIMIT $3::int
), d AS (
	DELETE FROM ` + events + ` e
	WHERE e.id = ANY(ARRAY(SELECT w.id FROM w WHERE w.at < $1 AND w.keep IS NOT TRUE))
	RETURNING e.id
), m AS (
	INSERT INTO ` + pruned + ` AS p (through)
	SELECT max(d.id) FROM d HAVING max(d.id) IS NOT NULL
	ON CONFLICT (one) DO UPDATE SET through = GREATEST(p.through, EXCLUDED.through)
)
SELECT (SELECT max(w.id) FROM w), (SELECT count(*) FROM d), coalesce((SELECT bool_or(w.at >= $1) FROM w), true)`
}
