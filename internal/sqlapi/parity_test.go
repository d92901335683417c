package sqlapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

var runAt = time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC)

// parityCases are enqueued through the Go client and through the SQL
// functions; every option and default appears in at least one.
var parityCases = []queue.NewJob{
	{Kind: "a"},
	{Kind: "b", Queue: "q1", Payload: map[string]any{"x": 1, "s": "é"}},
	{Kind: "c", Priority: -5, MaxAttempts: 3},
	{Kind: "d", Delay: 90 * time.Second},
	{Kind: "e", RunAfter: runAt},
	{Kind: "f", UniqueKey: "k1"},
	{Kind: "f", Queue: "q1", UniqueKey: "k1"}, // held by the "f" before (scoped by kind): its id, nothing written
	{Kind: "f-again", UniqueKey: "k1"},        // another kind: its own key space
	{Kind: "g", Payload: json.RawMessage(`[1, "two", null]`)},
	{Kind: "h", RunAfter: runAt, Delay: 5 * time.Second}, // run_after wins
	{Kind: "i", Queue: "q1", Priority: 32767, MaxAttempts: 1, UniqueKey: "k2", Delay: time.Millisecond},
	{Kind: "j", UniqueKey: "k3", UniqueScope: queue.UniqueByQueue, UniqueHold: queue.UniqueHoldSucceeded},
	{Kind: "l", UniqueKey: "k4", UniqueHold: queue.UniqueHoldPending},
	{Kind: "m", UniqueKey: "k5", UniquePeriod: time.Minute},
	{Kind: "n", Metadata: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
}

// sqlArgs renders a job as enqueue's named arguments, only those it sets
// (the rest take the SQL defaults), starting at placeholder $2 ($1 is kind).
func sqlArgs(j queue.NewJob) (string, []any) {
	var names []string
	args := []any{j.Kind}
	add := func(name, typ string, v any) {
		args = append(args, v)
		names = append(names, fmt.Sprintf("%s => $%d::%s", name, len(args), typ))
	}
	if j.Payload != nil {
		add("payload", "jsonb", string(payloadJSON(j.Payload)))
	}
	if j.Queue != "" {
		add("queue", "text", j.Queue)
	}
	if !j.RunAfter.IsZero() {
		add("run_after", "timestamptz", j.RunAfter)
	}
	if j.Delay != 0 {
		add("delay", "interval", j.Delay)
	}
	if j.Priority != 0 {
		add("priority", "integer", j.Priority)
	}
	if j.MaxAttempts != 0 {
		add("max_attempts", "integer", j.MaxAttempts)
	}
	if j.UniqueKey != "" {
		add("unique_key", "text", j.UniqueKey)
	}
	if j.UniqueScope != "" {
		add("unique_scope", "text", string(j.UniqueScope))
	}
	if j.UniqueHold != "" {
		add("unique_hold", "text", string(j.UniqueHold))
	}
	if j.UniquePeriod != 0 {
		add("unique_period", "interval", j.UniquePeriod)
	}
	if j.Metadata != nil {
		add("metadata", "jsonb", j.Metadata)
	}
	s := "$1::text"
	if len(names) > 0 {
		s += ", " + strings.Join(names, ", ")
	}
	return s, args
}

func payloadJSON(p any) []byte {
	if raw, ok := p.(json.RawMessage); ok {
		return raw
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return b
}

// manyJSON renders jobs as enqueue_many's argument.
func manyJSON(jobs []queue.NewJob) string {
	var out []map[string]any
	for _, j := range jobs {
		m := map[string]any{"kind": j.Kind}
		if j.Payload != nil {
			m["payload"] = json.RawMessage(payloadJSON(j.Payload))
		}
		if j.Queue != "" {
			m["queue"] = j.Queue
		}
		if !j.RunAfter.IsZero() {
			m["run_after"] = j.RunAfter.Format(time.RFC3339Nano)
		}
		if j.Delay != 0 {
			m["delay"] = j.Delay.Seconds()
		}
		if j.Priority != 0 {
			m["priority"] = j.Priority
		}
		if j.MaxAttempts != 0 {
			m["max_attempts"] = j.MaxAttempts
		}
		if j.UniqueKey != "" {
			m["unique_key"] = j.UniqueKey
		}
		if j.UniqueScope != "" {
			m["unique_scope"] = j.UniqueScope
		}
		if j.UniqueHold != "" {
			m["unique_hold"] = j.UniqueHold
		}
		if j.UniquePeriod != 0 {
			m["unique_period"] = j.UniquePeriod.Seconds()
		}
		if j.Metadata != nil {
			m["metadata"] = j.Metadata
		}
		out = append(out, m)
	}
	b, err := json.Marshal(out)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// snapshot is every job and event of a schema, ids and times made relative
// (ids as positions, a run_after within a day of the enqueue as the delay).
func (w *world) snapshot() []string {
	w.t.Helper()
	rows, err := w.admin.Query(context.Background(), `
SELECT pg_catalog.format('job #%s queue=%s kind=%s payload=%s priority=%s state=%s attempts=%s max_attempts=%s unique_key=%s unique_scope=%s unique_hold=%s metadata=%s last_error=%s finished=%s run_after=%s',
	pg_catalog.row_number() OVER (ORDER BY j.id), j.queue, j.kind, j.payload::text, j.priority, j.state, j.attempts, j.max_attempts,
	coalesce(j.unique_key, '-'), coalesce(j.unique_scope, '-'), coalesce(j.unique_hold, '-'), coalesce(j.metadata::text, '-'), coalesce(j.last_error, '-'), j.finished_at IS NOT NULL,
	CASE WHEN j.run_after < j.created_at + interval '1 day' THEN 'now+' || (j.run_after - j.created_at)::text ELSE j.run_after::text END)
	|| (SELECT ' events=' || pg_catalog.string_agg(pg_catalog.format('%s/%s/%s/%s/run_after_matches=%s', e.type, e.queue, e.kind, e.attempt,
		(e.data->>'run_after')::timestamptz = j.run_after), ',' ORDER BY e.id)
		FROM `+w.table("events")+` e WHERE e.job_id = j.id)
FROM `+w.table("jobs")+` j ORDER BY j.id`)
	require.NoError(w.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(w.t, err)
	return out
}

// positions maps returned ids to their job's position in the schema, so
// that two schemas' answers compare.
func (w *world) positions(ids []int64) []int {
	w.t.Helper()
	rows, err := w.admin.Query(context.Background(), `SELECT id FROM `+w.table("jobs")+` ORDER BY id`)
	require.NoError(w.t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(w.t, err)
	pos := map[int64]int{}
	for i, id := range all {
		pos[id] = i + 1
	}
	var out []int
	for _, id := range ids {
		out = append(out, pos[id])
	}
	return out
}

// TestGoAndSQLAgree enqueues the same jobs, one by one in a transaction and
// then as one batch, through the Go client (EnqueueTx, EnqueueManyTx) and
// through the SQL functions (enqueue with only the arguments a job sets,
// enqueue_many), in two schemas, and compares every job row and event and
// the ids returned.
func TestGoAndSQLAgree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	goW, sqlW := newWorld(t), newWorld(t)
	c, err := queue.New(goW.admin, queue.Config{Schema: goW.schema})
	require.NoError(t, err)
	batch := make([]queue.NewJob, len(parityCases))
	for i, j := range parityCases {
		if j.UniqueKey != "" {
			j.UniqueKey += "-batch"
		}
		batch[i] = j
	}

	var goIDs, sqlIDs []int64
	require.NoError(t, pgx.BeginFunc(ctx, goW.admin, func(tx pgx.Tx) error {
		for _, j := range parityCases {
			r, err := c.EnqueueTx(ctx, tx, j)
			if err != nil {
				return err
			}
			goIDs = append(goIDs, r.ID)
		}
		res, err := c.EnqueueManyTx(ctx, tx, batch)
		for _, r := range res {
			goIDs = append(goIDs, r.ID)
		}
		return err
	}))
	prod := sqlW.producerPool()
	require.NoError(t, pgx.BeginFunc(ctx, prod, func(tx pgx.Tx) error {
		for _, j := range parityCases {
			args, vals := sqlArgs(j)
			var id int64
			if err := tx.QueryRow(ctx, `SELECT `+sqlW.fn("enqueue")+`(`+args+`)`, vals...).Scan(&id); err != nil {
				return fmt.Errorf("%s: %w", args, err)
			}
			sqlIDs = append(sqlIDs, id)
		}
		var ids []int64
		if err := tx.QueryRow(ctx, `SELECT `+sqlW.fn("enqueue_many")+`($1::jsonb)`, manyJSON(batch)).Scan(&ids); err != nil {
			return err
		}
		sqlIDs = append(sqlIDs, ids...)
		return nil
	}))

	goSnap, sqlSnap := goW.snapshot(), sqlW.snapshot()
	require.Len(t, goSnap, 2*(len(parityCases)-1), "one job per case but the duplicate, twice")
	require.Equal(t, goSnap, sqlSnap)
	// One job at a time and a batch take different statements in
	// enqueue_jobs: they agree too.
	single, many := goSnap[:len(goSnap)/2], goSnap[len(goSnap)/2:]
	for i := range single {
		s := regexp.MustCompile(`unique_key=(k\d) `).ReplaceAllString(single[i], "unique_key=$1-batch ")
		require.Equal(t, s, strings.Replace(many[i], fmt.Sprintf("job #%d ", i+1+len(single)), fmt.Sprintf("job #%d ", i+1), 1))
	}
	require.Equal(t, goW.positions(goIDs), sqlW.positions(sqlIDs))
	// The duplicate got the holder's id in both.
	require.Equal(t, goIDs[5], goIDs[6])
	require.Equal(t, sqlIDs[5], sqlIDs[6])
}

// invalidCases are rejected by the Go client (a *queue.JobError naming the
// field) and by enqueue (the field's SQLSTATE, COLUMN = the field).
var invalidCases = []struct {
	job   queue.NewJob
	field string
	state string
}{
	{queue.NewJob{Kind: ""}, "kind", "PW001"},
	{queue.NewJob{Kind: "two words"}, "kind", "PW001"},
	{queue.NewJob{Kind: "tab\there"}, "kind", "PW001"},
	{queue.NewJob{Kind: strings.Repeat("k", 256)}, "kind", "PW001"},
	{queue.NewJob{Kind: "k", Queue: "Upper"}, "queue", "PW002"},
	{queue.NewJob{Kind: "k", Queue: "-dash"}, "queue", "PW002"},
	{queue.NewJob{Kind: "k", Queue: strings.Repeat("q", 64)}, "queue", "PW002"},
	{queue.NewJob{Kind: "k", Payload: json.RawMessage(`{"big":"` + strings.Repeat("x", 1<<20) + `"}`)}, "payload", "PW003"},
	{queue.NewJob{Kind: "k", Priority: 32768}, "priority", "PW004"},
	{queue.NewJob{Kind: "k", Priority: -32769}, "priority", "PW004"},
	{queue.NewJob{Kind: "k", Delay: -time.Second}, "delay", "PW005"},
	{queue.NewJob{Kind: "k", MaxAttempts: -1}, "max_attempts", "PW006"},
	{queue.NewJob{Kind: "k", UniqueKey: strings.Repeat("u", 1025)}, "unique_key", "PW007"},
}

// TestInvalidInputSameFieldNothingWritten: each invalid job is refused by
// the Go client and by enqueue and enqueue_many (as the batch's second job,
// after a valid one) with the field named, and neither writes anything.
func TestInvalidInputSameFieldNothingWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	c, err := queue.New(w.admin, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	prod := w.producerPool()
	for _, tc := range invalidCases {
		name := fmt.Sprintf("%s/%.20s", tc.field, fmt.Sprint(tc.job))
		_, err := c.EnqueueMany(ctx, []queue.NewJob{{Kind: "ok"}, tc.job})
		var je *queue.JobError
		require.True(t, errors.As(err, &je), "%s: Go: %v", name, err)
		require.Equal(t, tc.field, je.Field, name)

		args, vals := sqlArgs(tc.job)
		_, err = prod.Exec(ctx, `SELECT `+w.fn("enqueue")+`(`+args+`)`, vals...)
		requireState(t, err, tc.state, tc.field, 0, name+": enqueue")

		_, err = prod.Exec(ctx, `SELECT `+w.fn("enqueue_many")+`($1::jsonb)`, manyJSON([]queue.NewJob{{Kind: "ok"}, tc.job}))
		requireState(t, err, tc.state, tc.field, 1, name+": enqueue_many")
	}
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")))
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("events")))
}

// TestEnqueueManyShape: what enqueue_many refuses before looking at the
// jobs, with PW008 (or the field's code for a value that does not parse).
func TestEnqueueManyShape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	prod := w.producerPool()
	for _, tc := range []struct {
		arg, state, column string
		ord                int
	}{
		{`{"kind": "k"}`, "PW008", "", -1},
		{`null`, "PW008", "", -1},
		{`[{"kind": "k"}, 3]`, "PW008", "job", 1},
		{`[{"kind": "k", "prio": 1}]`, "PW008", "prio", 0},
		{`[{"kind": 7}]`, "PW008", "kind", 0},
		{`[{"kind": "k", "priority": "high"}]`, "PW008", "priority", 0},
		{`[{"kind": "k", "priority": 1.5}]`, "PW004", "priority", 0},
		{`[{"kind": "k", "max_attempts": 3000000000}]`, "PW006", "max_attempts", 0},
		{`[{"kind": "k"}, {"kind": "k", "run_after": "soonish"}]`, "PW005", "run_after", 1},
		{`[{"kind": "k", "delay": "a while"}]`, "PW005", "delay", 0},
		{`[{"kind": "k", "unique_key": "u", "unique_period": "forever"}]`, "PW010", "unique_period", 0}, // PW005 before migration 0022
		{`[{"kind": "k", "unique_key": "u", "unique_period": 1e300}]`, "PW010", "unique_period", 0},
		{`[{"kind": "k"}, {"kind": "k", "metadata": {"n": 3}}]`, "PW012", "metadata", 1},
		{`[{"kind": "k", "metadata": ["a"]}]`, "PW012", "metadata", 0},
	} {
		_, err := prod.Exec(ctx, `SELECT `+w.fn("enqueue_many")+`($1::jsonb)`, tc.arg)
		requireState(t, err, tc.state, tc.column, tc.ord, tc.arg)
	}
	// enqueue's typed arguments are parsed by PostgreSQL before pgwake
	// runs: its own SQLSTATEs.
	_, err := prod.Exec(ctx, `SELECT `+w.fn("enqueue")+`('k', $1::text::jsonb)`, `{"not": json}`)
	requireCode(t, err, "22P02") // invalid_text_representation
	_, err = prod.Exec(ctx, `SELECT `+w.fn("enqueue")+`('k', delay => $1::text::interval)`, `a while`)
	requireCode(t, err, "22007") // invalid_datetime_format
	_, err = prod.Exec(ctx, `SELECT `+w.fn("enqueue_jobs")+`(ARRAY['a', 'b'], queues => ARRAY['q'])`)
	requireState(t, err, "PW008", "", -1, "enqueue_jobs with arrays of unequal length")
	_, err = prod.Exec(ctx, `SELECT `+w.fn("enqueue")+`('k', run_after => 'infinity')`)
	requireState(t, err, "PW005", "run_after", 0, "run_after infinity")
	var ids []int64
	require.NoError(t, prod.QueryRow(ctx, `SELECT `+w.fn("enqueue_many")+`('[]')`).Scan(&ids))
	require.Empty(t, ids)
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")))

	// NULL takes the default (kind has none).
	_, err = prod.Exec(ctx, `SELECT `+w.fn("enqueue")+`(NULL)`)
	requireState(t, err, "PW001", "kind", 0, "NULL kind")
	var nullID int64
	require.NoError(t, prod.QueryRow(ctx, `SELECT `+w.fn("enqueue")+`('k', NULL, NULL, NULL, NULL, NULL, NULL, NULL)`).Scan(&nullID))
	require.Equal(t, 1, w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE id = $1 AND queue = 'default' AND payload = '{}'
		AND priority = 0 AND max_attempts = 5 AND unique_key IS NULL AND run_after = created_at`, nullID))
	_, err = w.admin.Exec(ctx, `DELETE FROM `+w.table("jobs"))
	require.NoError(t, err)

	// An empty unique key is no key: two jobs.
	var a, b int64
	require.NoError(t, prod.QueryRow(ctx, `SELECT `+w.fn("enqueue")+`('k', unique_key => '')`).Scan(&a))
	require.NoError(t, prod.QueryRow(ctx, `SELECT `+w.fn("enqueue")+`('k', unique_key => '')`).Scan(&b))
	require.NotEqual(t, a, b)
	require.Equal(t, 2, w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE unique_key IS NULL`))
}

// requireState checks a pgwake SQL API error: SQLSTATE, COLUMN, and the
// message naming the job's position (ord < 0: no position).
func requireState(t *testing.T, err error, state, column string, ord int, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: want SQLSTATE %s, got %v", what, state, err)
	require.Equal(t, state, pgErr.Code, "%s: %s", what, pgErr.Message)
	require.Equal(t, column, pgErr.ColumnName, "%s: %s", what, pgErr.Message)
	if ord >= 0 {
		require.True(t, strings.HasPrefix(pgErr.Message, fmt.Sprintf("pgwake: job %d: %s: ", ord, column)), "%s: %s", what, pgErr.Message)
	}
}

// TestOneWakeUpPerQueue: with a worker marked idle on queues w1 and w2 (and
// none on w3), a batch of jobs on the three queues sends one NOTIFY for w1
// and one for w2, through the Go client and through enqueue_many alike; a
// delayed job's carries its delay.
func TestOneWakeUpPerQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	_, err := w.admin.Exec(ctx, `INSERT INTO `+w.table("waiters")+` (queue, client_id) VALUES ('w1', 'test'), ('w2', 'test')`)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `LISTEN `+pgx.Identifier{queue.WakeChannel(w.schema)}.Sanitize())
	require.NoError(t, err)
	received := func() []string {
		var got []string
		for {
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				sort.Strings(got)
				return got
			}
			q, _, _ := strings.Cut(n.Payload, "|")
			if strings.Contains(n.Payload, "|") {
				q += "|delayed"
			}
			got = append(got, q)
		}
	}
	jobs := []queue.NewJob{{Kind: "k", Queue: "w1"}, {Kind: "k", Queue: "w1"}, {Kind: "k", Queue: "w2", Delay: time.Minute}, {Kind: "k", Queue: "w3"}}
	want := []string{"w1", "w2|delayed"}

	c, err := queue.New(w.admin, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	_, err = c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	require.Equal(t, want, received(), "Go client")

	_, err = w.producerPool().Exec(ctx, `SELECT `+w.fn("enqueue_many")+`($1::jsonb)`, manyJSON(jobs))
	require.NoError(t, err)
	require.Equal(t, want, received(), "enqueue_many")

	// Rolled back: no wake-up.
	rollback := errors.New("roll back")
	require.ErrorIs(t, pgx.BeginFunc(ctx, w.producerPool(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT `+w.fn("enqueue")+`('k', queue => 'w1')`)
		require.NoError(t, err)
		return rollback
	}), rollback)
	require.Empty(t, received(), "rolled back")
}

func requireCode(t *testing.T, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got %v", code, err)
	require.Equal(t, code, pgErr.Code, pgErr.Message)
}
