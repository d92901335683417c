package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/sqlident"
)

//go:embed sql/*.sql
var files embed.FS

// DefaultSchema is the schema pgwake uses when none is configured.
const DefaultSchema = "pgwake"

// MaxSchemaLen bounds schema names so that derived names (the NOTIFY channel
// "<schema>_wake", slots, publications) stay within PostgreSQL's 63 bytes.
const MaxSchemaLen = 40

// ErrInvalidSchema is returned (wrapped) for a schema name that is not a plain
// identifier of [a-z0-9_], at most MaxSchemaLen bytes.
var ErrInvalidSchema = errors.New("invalid schema name")

// Migration is one embedded SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Applied is a migration recorded in the schema_migrations table.
type Applied struct {
	Version   int
	Name      string
	AppliedAt time.Time
}

// Status is what Status reports for one known migration.
type Status struct {
	Migration
	// AppliedAt is zero when the migration is pending.
	AppliedAt time.Time
}

// Pending returns the versions in st not applied yet, as "0013".
func Pending(st []Status) []string {
	var out []string
	for _, m := range st {
		if m.AppliedAt.IsZero() {
			out = append(out, fmt.Sprintf("%04d", m.Version))
		}
	}
	return out
}

// ValidateSchema checks a schema name against pgwake's identifier rules.
// Names PostgreSQL reserves are refused too: pg_* (the server refuses to
// create them) and information_schema, which pg_dump leaves out, so a
// backup would silently lack every job.
func ValidateSchema(schema string) error {
	if err := sqlident.Validate("schema", schema, MaxSchemaLen); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSchema, err)
	}
	if strings.HasPrefix(schema, "pg_") || schema == "information_schema" {
		return fmt.Errorf("%w: schema %q is PostgreSQL's own (pg_* and information_schema are reserved, and pg_dump skips them); pick another name", ErrInvalidSchema, schema)
	}
	return nil
}

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(name, "_")
		if !ok || !strings.HasSuffix(rest, ".sql") {
			return nil, fmt.Errorf("migration file %q: want NNNN_name.sql", name)
		}
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %q: bad version %q", name, num)
		}
		body, err := fs.ReadFile(files, "sql/"+name)
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(rest, ".sql"), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("two migrations with version %d", out[i].Version)
		}
	}
	return out, nil
}

// render substitutes the quoted schema into a migration's SQL, the
// schema's NOTIFY channel (queue.WakeChannel) as a string literal for
// {{wake_channel}}, and the name of the transaction-local setting that
// marks the event watchers' NOTIFY as queued (migration 0017) for
// {{events_notify_guc}}. The schema is validated: [a-z0-9_] needs no
// escaping.
func render(sql, schema string) string {
	return strings.NewReplacer("{{schema}}", sqlident.Quote(schema), "{{wake_channel}}", "'"+schema+"_wake'",
		"{{events_notify_guc}}", "'pgwake.events_notify_"+schema+"'").Replace(sql)
}

// Up applies every pending migration to schema (DefaultSchema when empty),
// creating the schema if needed. It returns the versions it applied.
//
// Concurrent calls are serialised by a lock on the schema's
// schema_migrations table, taken in the transaction that applies the
// migrations: only roles with write privileges on that table can take it, so
// no other role can make migrate wait (an advisory lock anyone can take on a
// predictable key could).
//
// Constraints a migration adds NOT VALID (so that adding them does not scan
// the table under an exclusive lock) are validated after the migrations
// commit, one transaction each, taking a lock that lets reads and writes go
// on. A row that breaks one returns an *InvalidRowsError; fix the rows and run
// Up again, which validates what is left.
//
// A migration that alters a table waits for the transactions using it to
// end, and while it waits every later statement on that table (enqueues,
// claims) queues behind it. So each lock wait is bounded (LockTimeout, 2 s
// by default): the migrations roll back, and Up tries again after a pause,
// five times in all, then returns ErrLockTimeout
// (TestMigrateDoesNotStallTheQueueBehindALongTransaction). A held-mode job
// running longer than that blocks it: migrate when no long job runs.
//
// Up refuses, with a *ForeignSchemaError, a schema (or schema_migrations
// table) that already exists and is owned by a role that is neither the
// current user, a role it is a member of, nor a superuser: that owner
// controls what runs there (a schema_migrations table it wrote would make Up
// report the schema up to date). UpWithOptions can allow it.
func Up(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	return up(ctx, pool, schema, 0, Options{})
}

// Options adjusts UpWithOptions.
type Options struct {
	// AllowForeignSchema migrates a schema owned by another role (see Up).
	// Default false.
	AllowForeignSchema bool
	// LockTimeout bounds each wait of a migration for a table lock (see
	// Up). Default DefaultLockTimeout; negative: no bound.
	LockTimeout time.Duration
}

// DefaultLockTimeout is Options.LockTimeout's default.
const DefaultLockTimeout = 2 * time.Second

// lockTries is how many times Up applies its migrations when a lock wait
// times out, doubling its pause between tries from half the lock timeout.
const lockTries = 5

// ErrLockTimeout is matched (errors.Is) by Up's error when a migration could
// not get its table locks in any of its tries.
var ErrLockTimeout = errors.New("migrations: a lock a migration needs stayed held")

// UpWithOptions is Up with options.
func UpWithOptions(ctx context.Context, pool *pgxpool.Pool, schema string, opts Options) ([]int, error) {
	return up(ctx, pool, schema, 0, opts)
}

// ErrForeignSchema is matched (errors.Is) by the *ForeignSchemaError Up
// returns.
var ErrForeignSchema = errors.New("migrations: schema owned by another role")

// ForeignSchemaError names the object of pgwake's schema another role owns.
type ForeignSchemaError struct {
	Object, Owner, User string
}

func (e *ForeignSchemaError) Error() string {
	return fmt.Sprintf("migrations: %s is owned by role %s, not by %s (or a role it belongs to): its owner controls what runs in it; "+
		"migrate as that role, drop it if nobody should have created it, or allow it explicitly (--allow-foreign-schema)", e.Object, e.Owner, e.User)
}

// Is makes errors.Is(err, ErrForeignSchema) true.
func (e *ForeignSchemaError) Is(target error) bool { return target == ErrForeignSchema }

// checkOwners returns a *ForeignSchemaError when schema or its
// schema_migrations table exists and is owned by a role current_user does
// not trust: itself, a role it is a member of (when it is not a superuser,
// for which every role counts as one), or a superuser.
func checkOwners(ctx context.Context, conn *pgx.Conn, schema string) error {
	rows, err := conn.Query(ctx, `
WITH me AS (SELECT oid, rolname, rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user)
SELECT o.what, r.rolname::text, me.rolname::text,
	r.oid OPERATOR(pg_catalog.=) me.oid OR r.rolsuper
	OR (NOT me.rolsuper AND pg_catalog.pg_has_role(me.oid, r.oid, 'MEMBER'))
FROM (
	SELECT 'schema ' OPERATOR(pg_catalog.||) n.nspname::text AS what, n.nspowner AS owner
	FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) $1::text
	UNION ALL
	SELECT 'table ' OPERATOR(pg_catalog.||) n.nspname::text OPERATOR(pg_catalog.||) '.schema_migrations', c.relowner
	FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
	WHERE n.nspname OPERATOR(pg_catalog.=) $1::text AND c.relname OPERATOR(pg_catalog.=) 'schema_migrations'::name
) o JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) o.owner CROSS JOIN me`, schema)
	if err != nil {
		return fmt.Errorf("migrations: check the owner of schema %s: %w", schema, err)
	}
	defer rows.Close()
	for rows.Next() {
		var e ForeignSchemaError
		var trusted bool
		if err := rows.Scan(&e.Object, &e.Owner, &e.User, &trusted); err != nil {
			return fmt.Errorf("migrations: check the owner of schema %s: %w", schema, err)
		}
		if !trusted {
			return &e
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("migrations: check the owner of schema %s: %w", schema, err)
	}
	return nil
}

// up is Up applying migrations up to version limit (all when 0).
func up(ctx context.Context, pool *pgxpool.Pool, schema string, limit int, opts Options) ([]int, error) {
	if pool == nil {
		return nil, errors.New("migrations: nil pool")
	}
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	all, err := All()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: acquire connection: %w", err)
	}
	defer conn.Release()

	if !opts.AllowForeignSchema {
		if err := checkOwners(ctx, conn.Conn(), schema); err != nil {
			return nil, err
		}
	}
	q := sqlident.Quote(schema)
	// Two migrators creating the schema at once: one of the IF NOT EXISTS
	// statements fails on a catalog unique index (or finds the other's row
	// type); the next try sees the object.
	for try := 0; ; try++ {
		err := createBookkeeping(ctx, conn.Conn(), q)
		if err == nil {
			break
		}
		var pgErr *pgconn.PgError
		// unique_violation, duplicate_object, duplicate_table, duplicate_schema
		if try < 5 && errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42710" || pgErr.Code == "42P07" || pgErr.Code == "42P06") {
			continue
		}
		return nil, err
	}
	ran, err := applyAll(ctx, conn.Conn(), schema, all, limit, opts.LockTimeout)
	if err != nil {
		return nil, err
	}
	if err := validateConstraints(ctx, conn.Conn(), schema); err != nil {
		return ran, err
	}
	return ran, nil
}

// applyAll applies the migrations of all not yet applied (up to limit) in
// one transaction, trying again after a lock wait timed out.
func applyAll(ctx context.Context, conn *pgx.Conn, schema string, all []Migration, limit int, lockTimeout time.Duration) ([]int, error) {
	if lockTimeout == 0 {
		lockTimeout = DefaultLockTimeout
	}
	pause := max(lockTimeout/2, 100*time.Millisecond) // then doubled: 1, 2, 4, 8 s by default
	for try := 1; ; try++ {
		ran, err := applyOnce(ctx, conn, schema, all, limit, lockTimeout)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
			return ran, err
		}
		if try == lockTries {
			return nil, fmt.Errorf("%w: %d tries, each waiting at most %s for a lock (a transaction using pgwake's tables, such as a long held-mode job, holds it): migrate again when it has ended: %w",
				ErrLockTimeout, lockTries, lockTimeout, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pause):
		}
		pause *= 2
	}
}

func applyOnce(ctx context.Context, conn *pgx.Conn, schema string, all []Migration, limit int, lockTimeout time.Duration) ([]int, error) {
	q := sqlident.Quote(schema)
	var ran []int
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		ran = nil
		// Self-conflicting: a second migrator waits here until we commit.
		if _, err := tx.Exec(ctx, `LOCK TABLE `+q+`.schema_migrations IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("migrations: lock schema_migrations: %w", err)
		}
		// From here on no lock wait is unbounded (see Up).
		if lockTimeout > 0 {
			if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('lock_timeout', $1, true)`, strconv.FormatInt(lockTimeout.Milliseconds(), 10)); err != nil {
				return err
			}
		}
		done, err := applied(ctx, tx, schema)
		if err != nil {
			return err
		}
		for _, m := range all {
			if _, ok := done[m.Version]; ok || (limit > 0 && m.Version > limit) {
				continue
			}
			if _, err := tx.Exec(ctx, render(m.SQL, schema)); err != nil {
				return fmt.Errorf("migrations: apply %04d_%s to schema %s: %w", m.Version, m.Name, schema, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("migrations: record %04d_%s: %w", m.Version, m.Name, err)
			}
			ran = append(ran, m.Version)
		}
		return nil
	})
	return ran, err
}

// ErrInvalidRows is matched (errors.Is) by the *InvalidRowsError Up returns.
var ErrInvalidRows = errors.New("migrations: rows break a constraint")

// InvalidRowsError names a constraint that rows of the schema break, so it
// could not be validated. Writes that break it are already refused.
type InvalidRowsError struct {
	Table, Constraint string
	Err               error
}

func (e *InvalidRowsError) Error() string {
	return fmt.Sprintf("migrations: rows of %s break constraint %s (new writes are already checked): fix or delete them, then run migrate again: %v",
		e.Table, e.Constraint, e.Err)
}

func (e *InvalidRowsError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrInvalidRows) true.
func (e *InvalidRowsError) Is(target error) bool { return target == ErrInvalidRows }

// validateConstraints validates every NOT VALID check constraint on the
// schema's tables, each in its own transaction (VALIDATE CONSTRAINT takes
// SHARE UPDATE EXCLUSIVE: reads and writes go on while it scans).
func validateConstraints(ctx context.Context, conn *pgx.Conn, schema string) error {
	rows, err := conn.Query(ctx, `
SELECT c.relname::text, k.conname::text
FROM pg_catalog.pg_constraint k
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) k.conrelid
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
WHERE n.nspname OPERATOR(pg_catalog.=) $1::text AND NOT k.convalidated AND k.contype OPERATOR(pg_catalog.=) 'c'::"char"
ORDER BY 1, 2`, schema)
	if err != nil {
		return fmt.Errorf("migrations: list constraints to validate: %w", err)
	}
	type pending struct{ table, constraint string }
	todo, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pending, error) {
		var p pending
		return p, r.Scan(&p.table, &p.constraint)
	})
	if err != nil {
		return fmt.Errorf("migrations: list constraints to validate: %w", err)
	}
	for _, p := range todo {
		_, err := conn.Exec(ctx, `ALTER TABLE `+sqlident.Quote(schema, p.table)+` VALIDATE CONSTRAINT `+sqlident.Quote(p.constraint))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23514" { // check_violation
			return &InvalidRowsError{Table: schema + "." + p.table, Constraint: p.constraint, Err: err}
		}
		if err != nil {
			return fmt.Errorf("migrations: validate %s on %s.%s: %w", p.constraint, schema, p.table, err)
		}
	}
	return nil
}

// createBookkeeping creates the schema and its schema_migrations table if
// they do not exist.
func createBookkeeping(ctx context.Context, conn *pgx.Conn, q string) error {
	if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+q); err != nil {
		return fmt.Errorf("migrations: create schema %s: %w", q, err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+q+`.schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("migrations: create schema_migrations: %w", err)
	}
	return nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func applied(ctx context.Context, conn querier, schema string) (map[int]Applied, error) {
	rows, err := conn.Query(ctx, `SELECT version, name, applied_at FROM `+sqlident.Quote(schema)+`.schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("migrations: read schema_migrations: %w", err)
	}
	out := map[int]Applied{}
	for rows.Next() {
		var a Applied
		if err := rows.Scan(&a.Version, &a.Name, &a.AppliedAt); err != nil {
			return nil, fmt.Errorf("migrations: read schema_migrations: %w", err)
		}
		out[a.Version] = a
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrations: read schema_migrations: %w", err)
	}
	return out, nil
}

// StatusOf lists every known migration with the time it was applied to schema
// (zero when pending). A schema that does not exist yet has every migration pending.
func StatusOf(ctx context.Context, pool *pgxpool.Pool, schema string) ([]Status, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	all, err := All()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: acquire connection: %w", err)
	}
	defer conn.Release()
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, sqlident.Quote(schema, "schema_migrations")).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrations: look for schema_migrations: %w", err)
	}
	done := map[int]Applied{}
	if exists {
		if done, err = applied(ctx, conn.Conn(), schema); err != nil {
			return nil, err
		}
	}
	out := make([]Status, 0, len(all))
	for _, m := range all {
		out = append(out, Status{Migration: m, AppliedAt: done[m.Version].AppliedAt})
	}
	return out, nil
}
