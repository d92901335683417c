package queue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/queue"
)

// A handler that changes a setting through its tx: a role without
// pgwake's grants or a 1 ms timeout, SET LOCAL or not, would fail its own
// job's completion and, in held mode, the next handlers of its batch; a
// change without LOCAL commits with the job and would stay with the
// connection, for pgwake's statements and the application's. pgwake
// restores the role and timeouts after the handler, and closes a
// connection whose session a handler changed instead of returning it to
// the pool. Held and leased: every job succeeds at its first attempt, and
// no connection of the pool keeps the setting.
func TestHandlerSettingsDoNotOutliveItsJob(t *testing.T) {
	t.Parallel()
	role := fmt.Sprintf("pgwake_nobody_%d", time.Now().UnixNano()%1e9)
	_, err := pgtest.Pool(t).Exec(context.Background(), `CREATE ROLE `+sqlident.Quote(role)+` NOLOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), `DROP ROLE IF EXISTS `+sqlident.Quote(role))
	})
	settings := map[string]string{
		"role":       `SET ROLE ` + sqlident.Quote(role),
		"timeout":    `set statement_timeout = '1ms'`,
		"set_config": `SELECT pg_catalog.set_config('application_name', 'changed', false)`,
		"second":     `SELECT 1; SET lock_timeout = '1ms'`,
		"listen":     `LISTEN pgwake_session_test`,
		"local-role": `SET LOCAL ROLE ` + sqlident.Quote(role),
	}
	bothModes(t, func(t *testing.T, leased bool) {
		for name, stmt := range settings {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				testSessionSetting(t, leased, stmt, false)
			})
		}
		// Through a nested transaction (tx.Begin) of the handler's.
		for name, stmt := range map[string]string{"nested-role": settings["role"], "nested-listen": settings["listen"]} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				testSessionSetting(t, leased, stmt, true)
			})
		}
	})
}

func testSessionSetting(t *testing.T, leased bool, stmt string, nested bool) {
	var schema string
	cfg := queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Backoff: fastBackoff,
		Handlers: map[string]queue.Handler{
			"x": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				return effect(ctx, tx, schema, j)
			}),
			"set": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				if err := effect(ctx, tx, schema, j); err != nil {
					return err
				}
				if !nested {
					_, err := tx.Exec(ctx, stmt)
					return err
				}
				sub, err := tx.Begin(ctx)
				if err != nil {
					return err
				}
				if _, err := sub.Exec(ctx, stmt); err != nil {
					return err
				}
				return sub.Commit(ctx)
			}),
		},
	}
	if leased {
		cfg.LeasedKinds = []string{"x", "set"}
	}
	e := newEnvOwnPool(t, 6, cfg)
	schema = e.schema
	var user, app, timeout string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT current_user, current_setting('application_name'), current_setting('statement_timeout') || '/' || current_setting('lock_timeout') || '/' || (SELECT count(*) FROM pg_catalog.pg_listening_channels())`).Scan(&user, &app, &timeout))
	e.run()
	var ids []int64
	for range 3 {
		ids = append(ids, e.enqueueIDs(queue.NewJob{Kind: "x"}, queue.NewJob{Kind: "set"}, queue.NewJob{Kind: "x"}, queue.NewJob{Kind: "x"})...)
		q := pgtest.Pool(t)
		waitFor(t, 30*time.Second, "round done", func() bool {
			var n int
			require.NoError(t, q.QueryRow(context.Background(), `SELECT count(*) FROM `+e.table("jobs")+` WHERE id = ANY($1) AND state = 'succeeded'`, ids).Scan(&n))
			return n == len(ids)
		})
	}
	if strings.Contains(stmt, "statement_timeout = '1ms'") {
		// pgwake's own statement that puts the timeout back runs under
		// it: on a loaded machine it can take over 1 ms and fail the
		// attempt (the next one succeeds). Without the restore every
		// attempt's COMMIT (a WAL flush) runs under 1 ms and jobs go on
		// failing.
		require.Equal(t, len(ids), e.count(`id = ANY($1) AND attempts <= 2`, ids), "each job succeeded by its second attempt")
	} else {
		require.Equal(t, len(ids), e.count(`id = ANY($1) AND attempts = 1`, ids), "each job succeeded at its first attempt")
	}
	// Every idle connection of the pool has the settings it began with. The
	// running client may hold every connection for a moment (AcquireAllIdle
	// then returns none): look again until one is idle.
	var conns []*pgxpool.Conn
	waitFor(t, 30*time.Second, "an idle connection", func() bool {
		conns = e.pool.AcquireAllIdle(context.Background())
		return len(conns) > 0
	})
	var got [][]string
	for _, conn := range conns {
		var u, a, to string
		err := conn.QueryRow(context.Background(), `SELECT current_user, current_setting('application_name'), current_setting('statement_timeout') || '/' || current_setting('lock_timeout') || '/' || (SELECT count(*) FROM pg_catalog.pg_listening_channels())`).Scan(&u, &a, &to)
		got = append(got, []string{u, a, to, fmt.Sprint(err)})
	}
	for _, conn := range conns {
		conn.Release()
	}
	for _, g := range got {
		require.Equal(t, []string{user, app, timeout, "<nil>"}, g)
	}
}

// A pool whose connections get their role from the startup packet
// (RuntimeParams "role", or options=-c role=...) or from AfterConnect's SET
// ROLE, logging in as a NOINHERIT role without pgwake's grants: after a
// handler's SET LOCAL ROLE, pgwake's statements run as the pool's role
// again. Before, SET LOCAL ROLE NONE put back the login role and every job
// failed with permission denied; SET LOCAL role TO DEFAULT alone still
// fails the AfterConnect pool (its role is not a start value), so pgwake
// reads the role before the handler's first statement that may change it
// (saw). Held and leased.
func TestHandlerRoleRestoredToThePoolsRole(t *testing.T) {
	t.Parallel()
	admin := pgtest.Pool(t)
	ctx := context.Background()
	var owner string
	require.NoError(t, admin.QueryRow(ctx, `SELECT current_user`).Scan(&owner))
	suffix := time.Now().UnixNano() % 1e9
	login := fmt.Sprintf("pgwake_login_%d", suffix)
	nobody := fmt.Sprintf("pgwake_nobody2_%d", suffix)
	_, err := admin.Exec(ctx, `CREATE ROLE `+sqlident.Quote(nobody)+` NOLOGIN; CREATE ROLE `+sqlident.Quote(login)+` LOGIN NOINHERIT PASSWORD '`+login+`';
		GRANT `+sqlident.Quote(owner)+`, `+sqlident.Quote(nobody)+` TO `+sqlident.Quote(login))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+sqlident.Quote(login)+`; DROP ROLE IF EXISTS `+sqlident.Quote(nobody))
	})
	pools := map[string]func(*pgxpool.Config){
		"startup": func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["role"] = owner },
		"afterconnect": func(c *pgxpool.Config) {
			c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
				_, err := conn.Exec(ctx, `SET ROLE `+sqlident.Quote(owner))
				return err
			}
		},
	}
	for name, setRole := range pools {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bothModes(t, func(t *testing.T, leased bool) {
				pool := pgtest.NewPool(t, func(c *pgxpool.Config) {
					c.MaxConns = 6
					c.ConnConfig.User, c.ConnConfig.Password = login, login
					setRole(c)
				})
				testPoolsRoleRestored(t, leased, pool, admin, login+"/"+owner, nobody)
			})
		})
	}
}

func testPoolsRoleRestored(t *testing.T, leased bool, pool, admin *pgxpool.Pool, users, nobody string) {
	ctx := context.Background()
	var schema string
	cfg := queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Backoff: fastBackoff,
		Handlers: map[string]queue.Handler{
			"x": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				if err := effect(ctx, tx, schema, j); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `SET LOCAL ROLE `+sqlident.Quote(nobody))
				return err
			}),
		},
	}
	if leased {
		cfg.LeasedKinds = []string{"x"}
	}
	var got string
	require.NoError(t, pool.QueryRow(ctx, `SELECT session_user || '/' || current_user`).Scan(&got))
	require.Equal(t, users, got)
	e := newEnvWithPool(t, pool, cfg)
	schema = e.schema
	var jobs []queue.NewJob
	for range 8 {
		jobs = append(jobs, queue.NewJob{Kind: "x", MaxAttempts: 1})
	}
	ids := e.enqueueIDs(jobs...)
	e.run()
	waitFor(t, 30*time.Second, "every job finished", func() bool {
		return e.count(`state IN ('succeeded', 'failed')`) == len(ids)
	})
	rows, err := admin.Query(ctx, `SELECT coalesce(last_error, '') FROM `+e.table("jobs")+` WHERE state <> 'succeeded'`)
	require.NoError(t, err)
	errs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, errs, "every job succeeded")
	require.Equal(t, len(ids), e.count(`state = 'succeeded' AND attempts = 1`))
}
