package sqlapi_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Metadata whose values are arrays is not a JSON object of strings: PW012
// and nothing written (migration 0023; jsonpath's lax mode let them by).
func TestMetadataArrayValuesRaisePW012(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	prod := w.producerPool()
	for _, md := range []string{`{"a": ["x"]}`, `{"a": []}`, `{"a": ["x", "y"]}`, `{"a": [{"b": "c"}]}`} {
		var id int64
		err := prod.QueryRow(ctx, `SELECT `+w.fn("enqueue")+`($1, metadata => $2::jsonb)`, testKind, md).Scan(&id)
		requireCode(t, err, "PW012")
		var ids []int64
		err = prod.QueryRow(ctx, `SELECT `+w.fn("enqueue_many")+`(jsonb_build_array(jsonb_build_object('kind', $1::text, 'metadata', $2::jsonb)))`,
			testKind, md).Scan(&ids)
		requireCode(t, err, "PW012")
	}
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")), "nothing written")
	var id int64
	require.NoError(t, prod.QueryRow(ctx, `SELECT `+w.fn("enqueue")+`($1, metadata => '{"a": "x", "b": ""}')`, testKind).Scan(&id),
		"an object of strings is still taken")
}

// run_after outside the years 1 to 9999 (which the Go client refuses, and
// which the event stream, Verify and jobs --json cannot read back) and a
// delay that lands there are PW005 on their field, nothing written.
func TestScheduleOutsideYearsOneTo9999(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	prod := w.producerPool()
	for _, ra := range []string{"0002-01-01 00:00:00+00 BC", "20000-01-01 00:00:00+00", "10000-01-01 00:00:00+00", "0001-01-01 00:00:00+01"} {
		var id int64
		err := prod.QueryRow(ctx, `SELECT `+w.fn("enqueue")+`($1, run_after => $2::timestamptz)`, testKind, ra).Scan(&id)
		requireState(t, err, "PW005", "run_after", 0, ra)
		var ids []int64
		err = prod.QueryRow(ctx, `SELECT `+w.fn("enqueue_many")+`(jsonb_build_array(jsonb_build_object('kind', $1::text, 'run_after', $2::text)))`,
			testKind, ra).Scan(&ids)
		requireState(t, err, "PW005", "run_after", 0, "enqueue_many "+ra)
	}
	for what, q := range map[string]string{
		"enqueue":            `SELECT ARRAY[` + w.fn("enqueue") + `('` + testKind + `', delay => '300000 years')]`,
		"enqueue, 7990 y":    `SELECT ARRAY[` + w.fn("enqueue") + `('` + testKind + `', delay => '7990 years')]`,
		"enqueue with a key": `SELECT ARRAY[` + w.fn("enqueue") + `('` + testKind + `', delay => '300000 years', unique_key => 'k')]`,
		"enqueue_many":       `SELECT ` + w.fn("enqueue_many") + `('[{"kind": "` + testKind + `", "delay": "300000 years"}]')`,
		"enqueue_many, two":  `SELECT ` + w.fn("enqueue_many") + `('[{"kind": "` + testKind + `", "delay": "300000 years"}, {"kind": "` + testKind + `"}]')`,
	} {
		var ids []int64
		err := prod.QueryRow(ctx, q).Scan(&ids)
		requireState(t, err, "PW005", "delay", 0, what)
	}
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")), "nothing written")
	for _, ok := range []string{
		`SELECT ` + w.fn("enqueue") + `('` + testKind + `', run_after => '9999-12-31 23:59:59+00')`,
		`SELECT ` + w.fn("enqueue") + `('` + testKind + `', run_after => '0001-01-01 00:00:00+00')`,
		`SELECT ` + w.fn("enqueue") + `('` + testKind + `', delay => '7000 years')`,
	} {
		var id int64
		require.NoError(t, prod.QueryRow(ctx, ok).Scan(&id), ok)
	}
}

// enqueue_jobs reads its arrays by index: one that is not one-dimensional
// from index 1 is PW008, not read as the defaults (migration 0023).
func TestEnqueueJobsArraysStartAtOne(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	prod := w.producerPool()
	for what, args := range map[string]string{
		"payloads from 0":   `ARRAY[$1], '[0:0]={"{\"important\": 1}"}'::jsonb[], priorities => '{7}'::int[]`,
		"priorities from 0": `ARRAY[$1], priorities => '[0:0]={7}'::int[]`,
		"kinds from 2":      `'[2:2]={k}'::text[], priorities => '{7}'::int[]`,
		"two dimensions":    `ARRAY[$1, $1], queues => '{{a},{b}}'::text[]`,
	} {
		q := `SELECT ids FROM ` + w.fn("enqueue_jobs") + `(` + args + `)`
		var ids []int64
		var err error
		if what == "kinds from 2" {
			err = prod.QueryRow(ctx, q).Scan(&ids)
		} else {
			err = prod.QueryRow(ctx, q, testKind).Scan(&ids)
		}
		requireCode(t, err, "PW008")
	}
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")), "nothing written")
}

// A unique scope, hold or period without a unique key is refused as the Go
// client refuses it (PW007 on unique_key), nothing written; it was written
// with the option and no key (migration 0023).
func TestUniqueOptionsNeedAKey(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	prod := w.producerPool()
	for _, args := range []string{`$1, unique_period => interval '1 hour'`, `$1, unique_hold => 'pending'`, `$1, unique_scope => 'queue'`,
		`$1, unique_key => '', unique_scope => 'queue'`} {
		var id int64
		err := prod.QueryRow(ctx, `SELECT `+w.fn("enqueue")+`(`+args+`)`, testKind).Scan(&id)
		requireState(t, err, "PW007", "unique_key", 0, args)
	}
	var ids []int64
	err := prod.QueryRow(ctx, `SELECT `+w.fn("enqueue_many")+`(jsonb_build_array(jsonb_build_object('kind', $1::text), jsonb_build_object('kind', $1::text, 'unique_hold', 'pending')))`,
		testKind).Scan(&ids)
	requireState(t, err, "PW007", "unique_key", 1, "enqueue_many")
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")), "nothing written")
}

// Two-phase commit: PostgreSQL refuses to PREPARE a transaction that sent
// a NOTIFY, which an enqueue does when a worker is idle on its queue (and
// always under REPEATABLE READ or SERIALIZABLE). SET LOCAL
// pgwake.no_notify = on makes the transaction's enqueues send none: it
// can be prepared and committed, its jobs then found by the workers' poll.
func TestEnqueueInATwoPhaseCommit(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	var mpt int
	require.NoError(t, w.admin.QueryRow(ctx, `SELECT current_setting('max_prepared_transactions')::int`).Scan(&mpt))
	if mpt == 0 {
		t.Skip("max_prepared_transactions = 0 on this server (the test harness's own cluster sets 10)")
	}
	w.startWorker("xa") // idle on the queue: an enqueue notifies
	conn, err := pgx.Connect(ctx, w.prodURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	exec := func(sql string) error { _, err := conn.Exec(ctx, sql); return err }
	enqueues := []string{
		`SELECT ` + w.fn("enqueue") + `('` + testKind + `', queue => 'xa')`,
		`SELECT ` + w.fn("enqueue") + `('` + testKind + `', queue => 'xa', unique_key => 'u1')`,
		`SELECT ` + w.fn("enqueue_many") + `('[{"kind": "` + testKind + `", "queue": "xa"}, {"kind": "` + testKind + `", "queue": "xa"}]')`,
	}
	for i, begin := range []string{`BEGIN`, `BEGIN ISOLATION LEVEL REPEATABLE READ`} {
		require.NoError(t, exec(begin))
		require.NoError(t, exec(enqueues[0]))
		requireCode(t, exec(`PREPARE TRANSACTION 'refused'`), "0A000") // and the transaction is rolled back
		require.NoError(t, exec(begin))
		require.NoError(t, exec(`SET LOCAL pgwake.no_notify = on`))
		for _, e := range enqueues {
			require.NoError(t, exec(e))
		}
		gid := fmt.Sprintf("pgwake_%d", i)
		require.NoError(t, exec(`PREPARE TRANSACTION '`+gid+`'`), begin)
		require.NoError(t, exec(`COMMIT PREPARED '`+gid+`'`))
	}
	require.Equal(t, 7, w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE queue = 'xa'`),
		"4 jobs in the first prepared transaction, 3 in the second (its unique key's job is the first's)")
}

// A priority out of range written into the statement (not a parameter) is
// PW004 on priority, as a parameter's is: enqueue_one cast it to smallint
// in its plan, folded before the check ran, and raised 22003 without the
// field (migration 0023).
func TestPriorityOutOfRangeLiteral(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	prod := w.producerPool()
	for _, q := range []string{
		`SELECT ` + w.fn("enqueue") + `('` + testKind + `', '{}', priority => 40000)`,
		`SELECT ` + w.fn("enqueue_one") + `('` + testKind + `', '{}', priority => -40000)`,
	} {
		for range 7 { // past the plan cache's first five custom plans
			_, err := prod.Exec(ctx, q)
			requireState(t, err, "PW004", "priority", 0, q)
		}
	}
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")), "nothing written")
}
