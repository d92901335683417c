package sqlapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/sqlident"
)

// TestAfterInsertTrigger: an AFTER INSERT trigger on a user table enqueues
// a job in the inserting transaction, as the producer role (the trigger
// function is SECURITY INVOKER). Rolled back: no job; committed: the job
// and its event exist and an idle worker (one-hour poll) runs it at once.
func TestAfterInsertTrigger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	signups := w.table("signups")
	_, err := w.admin.Exec(ctx, `
CREATE TABLE `+signups+` (email text NOT NULL);
CREATE FUNCTION `+w.fn("signup_welcome")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM `+w.fn("enqueue")+`('`+testKind+`', jsonb_build_object('email', NEW.email), queue => 'mail');
    RETURN NULL;
END
$$;
CREATE TRIGGER signup_welcome AFTER INSERT ON `+signups+`
    FOR EACH ROW EXECUTE FUNCTION `+w.fn("signup_welcome")+`();
GRANT INSERT ON `+signups+` TO `+sqlident.Quote(w.producer))
	require.NoError(t, err)
	wk := w.startWorker("mail")
	prod := w.producerPool()

	rollback := errors.New("roll back")
	require.ErrorIs(t, pgx.BeginFunc(ctx, prod, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+signups+` (email) VALUES ('gone@example.com')`)
		require.NoError(t, err)
		return rollback
	}), rollback)
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")))

	_, err = prod.Exec(ctx, `INSERT INTO `+signups+` (email) VALUES ('a@example.com')`)
	require.NoError(t, err)
	var id int64
	require.NoError(t, w.admin.QueryRow(ctx, `SELECT id FROM `+w.table("jobs")).Scan(&id))
	require.Equal(t, 1, w.count(`SELECT count(*) FROM `+w.table("events")+` WHERE job_id = $1 AND type = 'enqueued'`, id))
	wk.wait(t, []int64{id}, 10*time.Second)
	wk.mu.Lock()
	var p map[string]string
	require.NoError(t, json.Unmarshal([]byte(wk.payload[id]), &p))
	wk.mu.Unlock()
	require.Equal(t, map[string]string{"email": "a@example.com"}, p)

	// A bad input in the trigger fails the user's insert: nothing stays.
	_, err = w.admin.Exec(ctx, `CREATE OR REPLACE FUNCTION `+w.fn("signup_welcome")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM `+w.fn("enqueue")+`('`+testKind+`', queue => 'Not A Queue');
    RETURN NULL;
END
$$`)
	require.NoError(t, err)
	_, err = prod.Exec(ctx, `INSERT INTO `+signups+` (email) VALUES ('b@example.com')`)
	requireState(t, err, "PW002", "queue", 0, "trigger with a bad queue")
	require.Equal(t, 1, w.count(`SELECT count(*) FROM `+signups))
	require.Equal(t, 1, w.count(`SELECT count(*) FROM `+w.table("jobs")))
}

// TestCancelAndRetry: cancel and retry through SQL, as the app role (the
// producer role may not call them), with the events the Go client writes
// (it calls the same functions).
func TestCancelAndRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	prod := w.producerPool()
	var a, b int64
	require.NoError(t, prod.QueryRow(ctx, `SELECT `+w.fn("enqueue")+`('k', delay => '1 hour')`).Scan(&a))
	require.NoError(t, prod.QueryRow(ctx, `SELECT `+w.fn("enqueue")+`('k', max_attempts => 1)`).Scan(&b))
	_, err := prod.Exec(ctx, `SELECT `+w.fn("cancel")+`($1)`, a)
	requireDenied(t, err)
	_, err = prod.Exec(ctx, `SELECT `+w.fn("retry")+`($1)`, b)
	requireDenied(t, err)

	var ok1, ok2 bool
	require.NoError(t, w.admin.QueryRow(ctx, `SELECT `+w.fn("cancel")+`($1)`, a).Scan(&ok1))
	require.NoError(t, w.admin.QueryRow(ctx, `SELECT `+w.fn("cancel")+`($1)`, a).Scan(&ok2))
	require.Equal(t, []bool{true, false}, []bool{ok1, ok2}, "cancel, then cancel again")

	require.NoError(t, w.admin.QueryRow(ctx, `SELECT `+w.fn("retry")+`($1)`, b).Scan(&ok1))
	require.False(t, ok1, "retry of a pending job")
	_, err = w.admin.Exec(ctx, `UPDATE `+w.table("jobs")+` SET state = 'failed', attempts = 1, finished_at = now() WHERE id = $1`, b)
	require.NoError(t, err)
	require.NoError(t, w.admin.QueryRow(ctx, `SELECT `+w.fn("retry")+`($1)`, b).Scan(&ok1))
	require.True(t, ok1, "retry of a failed job")
	require.Equal(t, 1, w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE id = $1 AND state = 'pending' AND max_attempts = 2`, b))
	rows, err := w.admin.Query(ctx, `SELECT job_id::text || ' ' || type FROM `+w.table("events")+` ORDER BY id`)
	require.NoError(t, err)
	evs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{idType(a, "enqueued"), idType(b, "enqueued"), idType(a, "cancelled"), idType(b, "retried")}, evs)
}

func idType(id int64, typ string) string {
	b, _ := json.Marshal(id)
	return string(b) + " " + typ
}

func requireDenied(t *testing.T, err error) {
	t.Helper()
	requireCode(t, err, "42501")
}
