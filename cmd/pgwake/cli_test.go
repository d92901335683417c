package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// migrated returns a fresh schema migrated by `pgwake migrate`.
func migrated(t *testing.T) string {
	t.Helper()
	schema := pgtest.Schema(t)
	out := mustRun(t, "", "migrate", "--schema", schema)
	require.Contains(t, out, "applied 0001 to schema "+schema)
	return schema
}

type jobState struct {
	state     string
	attempts  int
	lastError string
}

func getJob(t *testing.T, schema string, id int64) jobState {
	t.Helper()
	var j jobState
	err := pgtest.Pool(t).QueryRow(context.Background(),
		`SELECT state, attempts, coalesce(last_error, '') FROM `+sqlident.Quote(schema, "jobs")+` WHERE id = $1`, id).
		Scan(&j.state, &j.attempts, &j.lastError)
	require.NoError(t, err)
	return j
}

func enqueueID(t *testing.T, stdin string, args ...string) int64 {
	t.Helper()
	out := mustRun(t, stdin, append([]string{"enqueue"}, args...)...)
	id, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	require.NoError(t, err, "enqueue printed %q", out)
	return id
}

func waitState(t *testing.T, schema string, id int64, state string) jobState {
	t.Helper()
	var j jobState
	waitFor(t, fmt.Sprintf("job %d to be %s", id, state), func() bool {
		j = getJob(t, schema, id)
		return j.state == state
	})
	return j
}

var metricsRE = regexp.MustCompile(`"metrics": "http://([^/"]+)/metrics"`)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestMigrateStatusAndIdempotence(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	out := mustRun(t, "", "migrate", "status", "--schema", schema)
	require.Regexp(t, `0001\s+init\s+pending`, out)
	mustRun(t, "", "migrate", "up", "--schema", schema)
	require.Contains(t, mustRun(t, "", "migrate", "--schema", schema), "is up to date")
	out = mustRun(t, "", "migrate", "status", "--schema", schema)
	require.NotContains(t, out, "pending")
	require.Regexp(t, `0001\s+init\s+\d{4}-`, out)
}

func TestWorkerExecHandlers(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	dir := t.TempDir()
	okOut := filepath.Join(dir, "ok.txt")
	pidFile := filepath.Join(dir, "grandchild.pid")

	okID := enqueueID(t, `{"greeting":"hello"}`, "--schema", schema, "--kind", "ok", "-")
	failID := enqueueID(t, "", "--schema", schema, "--kind", "fail", "--max-attempts", "1")
	slowID := enqueueID(t, "", "--schema", schema, "--kind", "slow", "--max-attempts", "1")
	unknownID := enqueueID(t, "", "--schema", schema, "--kind", "nobody", "--max-attempts", "1")

	w := startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "127.0.0.1:0",
		"--handler", `ok=exec:{ cat; echo; echo "$PGWAKE_JOB_ID $PGWAKE_JOB_KIND $PGWAKE_JOB_QUEUE $PGWAKE_JOB_ATTEMPT"; } > `+okOut,
		"--handler", `fail=exec:echo "line one" >&2; echo "the reason it broke" >&2; exit 7`,
		// A grandchild in the background: the timeout must kill it too.
		"--handler", `slow=exec:sleep 300 & echo $! > `+pidFile+`; wait`,
		"--kind-timeout", "slow=1s")
	addr := w.waitStderr(metricsRE)

	waitState(t, schema, okID, "succeeded")
	b, err := os.ReadFile(okOut)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("{\"greeting\": \"hello\"}\n%d ok default 1\n", okID), string(b))

	j := waitState(t, schema, failID, "failed")
	require.Equal(t, "exit status 7: line one\nthe reason it broke", j.lastError)

	j = waitState(t, schema, slowID, "failed")
	require.Contains(t, j.lastError, "command terminated (process group")
	require.Contains(t, j.lastError, "job timed out after 1s")
	pb, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(pb)))
	require.NoError(t, err)
	waitFor(t, "the timed-out command's grandchild to be gone", func() bool {
		return processGone(pid)
	})

	j = waitState(t, schema, unknownID, "failed")
	require.Contains(t, j.lastError, `no handler registered for kind "nobody"`)

	code, body := httpGet(t, "http://"+addr+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, body = httpGet(t, "http://"+addr+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `pgwake_worker_jobs_total{kind="ok",outcome="succeeded",queue="default"} 1`)
	require.Contains(t, body, `pgwake_worker_jobs_total{kind="fail",outcome="failed",queue="default"} 1`)
	require.Contains(t, body, `pgwake_queue_depth{queue="default",state="failed"} 3`)
	require.NotContains(t, body, "hello", "payloads never reach metrics")

	w.signal(syscall.SIGTERM)
	require.Equal(t, 0, w.wait())
	require.NotContains(t, w.stderr.String(), "greeting", "payloads are never logged")
}

func TestWorkerGracefulShutdown(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	dir := t.TempDir()
	started, finished := filepath.Join(dir, "started"), filepath.Join(dir, "finished")
	id := enqueueID(t, "", "--schema", schema, "--kind", "slow")

	// The handler waits for the test to create "go" after SIGTERM: a job
	// running at SIGTERM finishes and commits.
	goFile := filepath.Join(dir, "go")
	w := startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "off", "--shutdown-timeout", "60s",
		"--handler", fmt.Sprintf(`slow=exec:touch %s; while [ ! -e %s ]; do sleep 0.02; done; touch %s`, started, goFile, finished))
	waitFor(t, "the handler to start", func() bool { _, err := os.Stat(started); return err == nil })
	w.signal(syscall.SIGTERM)
	w.waitStderr(regexp.MustCompile(`shutting down gracefully`))
	require.NoError(t, os.WriteFile(goFile, nil, 0o644))
	require.Equal(t, 0, w.wait())
	_, err := os.Stat(finished)
	require.NoError(t, err)
	require.Equal(t, "succeeded", getJob(t, schema, id).state)
}

func TestWorkerSecondSignalStopsAtOnce(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	dir := t.TempDir()
	started, pidFile := filepath.Join(dir, "started"), filepath.Join(dir, "pid")
	id := enqueueID(t, "", "--schema", schema, "--kind", "stuck")
	w := startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "off", "--shutdown-timeout", "10m",
		"--handler", fmt.Sprintf(`stuck=exec:echo $$ > %s; touch %s; sleep 600`, pidFile, started))
	waitFor(t, "the handler to start", func() bool { _, err := os.Stat(started); return err == nil })
	w.signal(syscall.SIGTERM)
	w.waitStderr(regexp.MustCompile(`shutting down gracefully`))
	w.signal(syscall.SIGTERM)
	require.NotEqual(t, 0, w.wait())

	pb, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(pb)))
	require.NoError(t, err)
	waitFor(t, "the handler's process to be killed", func() bool { return processGone(pid) })
	// The claim transaction died with the connection: the job is pending, no
	// attempt counted, and claimable (its row lock is gone).
	waitFor(t, "the claim's row lock to be released", func() bool {
		var n int
		err := pgtest.Pool(t).QueryRow(context.Background(), `SELECT count(*) FROM (SELECT id FROM `+
			sqlident.Quote(schema, "jobs")+` WHERE id = $1 FOR UPDATE SKIP LOCKED) s`, id).Scan(&n)
		require.NoError(t, err)
		return n == 1
	})
	j := getJob(t, schema, id)
	require.Equal(t, "pending", j.state)
	require.Equal(t, 0, j.attempts)
}

func TestStatsJSON(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	ctx := context.Background()
	jobs := sqlident.Quote(schema, "jobs")

	out := mustRun(t, "", "stats", "--json", "--schema", schema)
	require.JSONEq(t, `{"queues":[]}`, out)

	for range 3 {
		enqueueID(t, "", "--schema", schema, "--kind", "k")
	}
	enqueueID(t, "", "--schema", schema, "--kind", "k", "--delay", "1h")
	enqueueID(t, "", "--schema", schema, "--kind", "k", "--queue", "other", "--run-after", "2099-01-01T00:00:00Z")
	failed := enqueueID(t, "", "--schema", schema, "--kind", "k", "--queue", "other")
	done := enqueueID(t, "", "--schema", schema, "--kind", "k", "--queue", "other")
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `UPDATE `+jobs+` SET state = 'failed', finished_at = now() WHERE id = $1`, failed)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET state = 'succeeded', finished_at = now() WHERE id = $1`, done)
	require.NoError(t, err)

	// One due job's attempt in flight, as a worker's claim records it.
	attempts := sqlident.Quote(schema, "attempts")
	_, err = pool.Exec(ctx, `INSERT INTO `+attempts+` (job_id, queue, attempt, batch, client_id)
		SELECT id, queue, 1, 1, 'w' FROM `+jobs+` WHERE state = 'pending' AND queue = 'default' AND run_after <= now() ORDER BY id LIMIT 1`)
	require.NoError(t, err)

	out = mustRun(t, "", "stats", "--json", "--schema", schema)
	var doc map[string][]map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Len(t, doc["queues"], 2)
	keys := func(m map[string]any) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		return ks
	}
	for _, q := range doc["queues"] {
		require.ElementsMatch(t, []string{"queue", "pending", "scheduled", "running", "failed",
			"succeeded_last_minute", "oldest_pending_age_seconds", "paused"}, keys(q))
	}
	def, other := doc["queues"][0], doc["queues"][1]
	require.Equal(t, "default", def["queue"])
	require.EqualValues(t, 2, def["pending"])
	require.EqualValues(t, 1, def["scheduled"])
	require.EqualValues(t, 1, def["running"])
	require.EqualValues(t, 0, def["failed"])
	require.Greater(t, def["oldest_pending_age_seconds"].(float64), 0.0)
	require.Equal(t, "other", other["queue"])
	require.EqualValues(t, 0, other["pending"])
	require.EqualValues(t, 1, other["scheduled"])
	require.EqualValues(t, 0, other["running"])
	require.EqualValues(t, 1, other["failed"])
	require.EqualValues(t, 1, other["succeeded_last_minute"])
	require.EqualValues(t, 0, other["oldest_pending_age_seconds"])

	// The table form shows the same.
	out = mustRun(t, "", "stats", "--schema", schema)
	require.Regexp(t, `default\s+2\s+1\s+1\s+0\s+0\s+\S+`, out)
	_, err = pool.Exec(ctx, `DELETE FROM `+attempts)
	require.NoError(t, err)
	out = mustRun(t, "", "stats", "--json", "--schema", schema)
	require.Contains(t, out, `"pending":3,"scheduled":1,"running":0`)

	// Above --exact-limit, a count is an estimate, shown as ~N and named.
	_, err = pool.Exec(ctx, `ANALYZE `+jobs)
	require.NoError(t, err)
	out = mustRun(t, "", "stats", "--exact-limit", "1", "--schema", schema)
	require.Regexp(t, `default\s+~\d+\s+1\s+0`, out)
	out = mustRun(t, "", "stats", "--json", "--exact-limit", "1", "--schema", schema)
	require.Contains(t, out, `"estimated":["pending"]`)
}

func TestJobsListFiltersAndPages(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	ctx := context.Background()
	var ids []int64
	for range 5 {
		ids = append(ids, enqueueID(t, "", "--schema", schema, "--kind", "k"))
	}
	_, err := pgtest.Pool(t).Exec(ctx, `UPDATE `+sqlident.Quote(schema, "jobs")+
		` SET state = 'failed', last_error = 'Disk FULL', finished_at = now() WHERE id = $1`, ids[1])
	require.NoError(t, err)
	out := mustRun(t, "", "jobs", "list", "--schema", schema, "--error", "disk full")
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+default\s+k\s+failed`, ids[1]), out)
	require.Equal(t, 2, strings.Count(out, "\n"), out) // header, one job, no next page

	out = mustRun(t, "", "jobs", "list", "--schema", schema, "--limit", "2")
	require.Contains(t, out, fmt.Sprintf("more: add --before %d\n", ids[3]))
	out = mustRun(t, "", "jobs", "list", "--schema", schema, "--limit", "2", "--before", strconv.FormatInt(ids[3], 10), "--json")
	var page []jobRow
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Equal(t, []int64{ids[2], ids[1]}, []int64{page[0].ID, page[1].ID})
	out = mustRun(t, "", "jobs", "list", "--schema", schema, "--created-after", "2099-01-01T00:00:00Z")
	require.Equal(t, "no jobs match\n", out)

	r := pgwake(t, "", "jobs", "list", "--schema", schema, "--created-after", "2099-01-01T00:00:00Z", "--created-before", "2098-01-01T00:00:00Z")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "CreatedBefore")
}

func TestJobsRetryCancelShow(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	ctx := context.Background()
	failed := enqueueID(t, "", "--schema", schema, "--kind", "k", "--max-attempts", "1")
	pending := enqueueID(t, "", "--schema", schema, "--kind", "k", "--delay", "1h", "--payload", `{"n":1}`)
	_, err := pgtest.Pool(t).Exec(ctx, `UPDATE `+sqlident.Quote(schema, "jobs")+
		` SET state = 'failed', attempts = 1, last_error = 'boom', finished_at = now() WHERE id = $1`, failed)
	require.NoError(t, err)

	out := mustRun(t, "", "jobs", "list", "--schema", schema, "--state", "failed")
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+default\s+k\s+failed\s+1/1`, failed), out)
	require.NotContains(t, out, fmt.Sprintf("\n%d ", pending))

	require.Equal(t, fmt.Sprintf("retried %d\n", failed), mustRun(t, "", "jobs", "retry", "--schema", schema, strconv.FormatInt(failed, 10)))
	j := getJob(t, schema, failed)
	require.Equal(t, "pending", j.state)

	r := pgwake(t, "", "jobs", "retry", "--schema", schema, strconv.FormatInt(failed, 10))
	require.Equal(t, 1, r.code)
	require.Equal(t, fmt.Sprintf("pgwake jobs: could not retry job(s) %d: no such job, or not failed (see `pgwake jobs show ID`); 0 other(s) done\n", failed), r.stderr)

	require.Equal(t, fmt.Sprintf("cancelled %d\n", pending), mustRun(t, "", "jobs", "cancel", strconv.FormatInt(pending, 10), "--schema", schema))
	require.Equal(t, "cancelled", getJob(t, schema, pending).state)
	r = pgwake(t, "", "jobs", "cancel", "--schema", schema, strconv.FormatInt(pending, 10))
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not pending")

	out = mustRun(t, "", "jobs", "show", strconv.FormatInt(pending, 10), "--json", "--schema", schema)
	var shown jobRow
	require.NoError(t, json.Unmarshal([]byte(out), &shown))
	require.Equal(t, "cancelled", string(shown.State))
	require.JSONEq(t, `{"n":1}`, string(shown.Payload))
	var types []string
	for _, e := range shown.Events {
		types = append(types, e.Type)
	}
	require.Equal(t, []string{"enqueued", "cancelled"}, types)

	out = mustRun(t, "", "jobs", "show", "--schema", schema, strconv.FormatInt(failed, 10))
	require.Regexp(t, `(?m)^\s+\S+ \S+ \S+\s+retried\s+attempt 1`, out)

	// --all-failed picks up every failed job of the filter.
	_, err = pgtest.Pool(t).Exec(ctx, `UPDATE `+sqlident.Quote(schema, "jobs")+` SET state = 'failed', finished_at = now() WHERE id = $1`, failed)
	require.NoError(t, err)
	require.Equal(t, "no failed jobs match\n", mustRun(t, "", "jobs", "retry", "--all-failed", "--kind", "other", "--schema", schema))
	require.Equal(t, fmt.Sprintf("retried %d\n", failed), mustRun(t, "", "jobs", "retry", "--all-failed", "--kind", "k", "--schema", schema))
}

func TestJobsPrune(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	ctx := context.Background()
	old := enqueueID(t, "", "--schema", schema, "--kind", "k")
	recent := enqueueID(t, "", "--schema", schema, "--kind", "k")
	failed := enqueueID(t, "", "--schema", schema, "--kind", "k")
	pending := enqueueID(t, "", "--schema", schema, "--kind", "k")
	jobs := sqlident.Quote(schema, "jobs")
	_, err := pgtest.Pool(t).Exec(ctx, `UPDATE `+jobs+` SET state = 'succeeded', finished_at = now() - interval '2 hours' WHERE id = $1;`, old)
	require.NoError(t, err)
	_, err = pgtest.Pool(t).Exec(ctx, `UPDATE `+jobs+` SET state = 'succeeded', finished_at = now() WHERE id = $1`, recent)
	require.NoError(t, err)
	_, err = pgtest.Pool(t).Exec(ctx, `UPDATE `+jobs+` SET state = 'failed', finished_at = now() - interval '30 days' WHERE id = $1`, failed)
	require.NoError(t, err)

	r := pgwake(t, "", "jobs", "prune", "--schema", schema+"_none")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "run `pgwake migrate --schema "+schema+"_none` first")
	r = pgwake(t, "", "jobs", "prune", "--schema", schema, "--succeeded", "0s")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "would delete every succeeded job")

	r = pgwake(t, "", "worker", "--schema", schema, "--handler", "k=exec:true", "--retain-cancelled", "0")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "--retain-cancelled 0 would delete every cancelled job")

	require.Equal(t, "deleted 1 jobs (1 succeeded, 0 cancelled, 0 failed)\n",
		mustRun(t, "", "jobs", "prune", "--schema", schema, "--succeeded", "1h", "--failed=-1s"))
	remaining := func() []int64 {
		var ids []int64
		rows, err := pgtest.Pool(t).Query(ctx, `SELECT id FROM `+jobs+` ORDER BY id`)
		require.NoError(t, err)
		for rows.Next() {
			var id int64
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
		return ids
	}
	require.Equal(t, []int64{recent, failed, pending}, remaining())
	// The history of a deleted job is still in the event log.
	out := mustRun(t, "", "jobs", "show", "--schema", schema, strconv.FormatInt(old, 10))
	require.Contains(t, out, "row deleted by retention")
	require.Regexp(t, `(?m)^\s+\S+ \S+ \S+\s+enqueued\s+attempt 0`, out)
	out = mustRun(t, "", "jobs", "show", "--json", "--schema", schema, strconv.FormatInt(old, 10))
	require.Contains(t, out, `"deleted": true`)
	require.Contains(t, out, `"kind": "k"`)
	require.Equal(t, "deleted 1 jobs (0 succeeded, 0 cancelled, 1 failed)\n", mustRun(t, "", "jobs", "prune", "--schema", schema))
	require.Equal(t, []int64{recent, pending}, remaining())
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	ctx := context.Background()
	jobs := sqlident.Quote(schema, "jobs")

	batch := `{"kind":"a","payload":{"x":1}}

{"kind":"b","queue":"q2","delay":"1h","priority":-3,"max_attempts":2}
{"payload":[1,2]}
`
	out := mustRun(t, batch, "enqueue", "--batch", "--kind", "dflt", "--schema", schema)
	lines := strings.Fields(out)
	require.Len(t, lines, 3)
	rows, err := pgtest.Pool(t).Query(ctx, `SELECT kind, queue, payload::text, priority, max_attempts, run_after > now() + interval '59 minutes'
		FROM `+jobs+` ORDER BY id`)
	require.NoError(t, err)
	type row struct {
		Kind, Queue, Payload  string
		Priority, MaxAttempts int
		Delayed               bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Equal(t, []row{
		{"a", "default", `{"x": 1}`, 0, 5, false},
		{"b", "q2", `{}`, -3, 2, true},
		{"dflt", "default", `[1, 2]`, 0, 5, false},
	}, got)

	// A bad line: nothing is written.
	r := pgwake(t, "{\"kind\":\"a\"}\n{\"kind\":\"b\",\"bogus\":1}\n", "enqueue", "--batch", "--schema", schema)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `--batch line 2: json: unknown field "bogus"`)
	// The line number counts blank lines too.
	r = pgwake(t, "{\"kind\":\"a\"}\n\n{\"kind\":\"b\",\"queue\":\"Bad Queue\"}\n", "enqueue", "--batch", "--schema", schema)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "line 3: queue: invalid queue name")
	// max_attempts 0 would silently become the default (5).
	r = pgwake(t, "{\"kind\":\"a\",\"max_attempts\":0}\n", "enqueue", "--batch", "--schema", schema)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--batch line 1: max_attempts 0: max attempts must be at least 1")
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+jobs).Scan(&n))
	require.Equal(t, 3, n)

	// Unique keys: the second enqueue returns the first id and says so.
	first := enqueueID(t, "", "--schema", schema, "--kind", "u", "--unique-key", "key-1")
	r = pgwake(t, "", "enqueue", "--schema", schema, "--kind", "u", "--unique-key", "key-1")
	require.Equal(t, 0, r.code)
	require.Equal(t, fmt.Sprintf("%d\n", first), r.stdout)
	require.Contains(t, r.stderr, "jobs' unique keys were held")

	// Bad input is a usage error naming the problem.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kind", "k", "--payload", "{nope"}, "the payload is not valid JSON"},
		{[]string{"--payload", "{}"}, "--kind is required"},
		{[]string{"--kind", "k", "--queue", "UPPER"}, "queue: invalid queue name"},
		{[]string{"--kind", "k", "--max-attempts", "-1"}, "max attempts must be at least 1"},
		{[]string{"--kind", "k", "--max-attempts", "0"}, "--max-attempts 0: max attempts must be at least 1"}, // not the default
		{[]string{"--kind", "k", "--run-after", "tomorrow"}, "--run-after \"tomorrow\" is not an RFC 3339 time"},
		{[]string{"--kind", "k", "--delay", "1s", "--run-after", "2030-01-01T00:00:00Z"}, "not both"},
	} {
		r := pgwake(t, "", append([]string{"enqueue", "--schema", schema}, tc.args...)...)
		require.Equal(t, 2, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want)
		require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
	}
}

func TestErrorMessages(t *testing.T) {
	t.Parallel()
	// A port nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())

	for _, cmd := range [][]string{{"stats"}, {"migrate"}, {"jobs", "list"}, {"enqueue", "--kind", "k"}, {"worker", "--handler", "k=exec:true"}} {
		r := pgwakeEnv(t, []string{envDatabaseURL + fmt.Sprintf("=postgres://app:s3cr3t-pw@127.0.0.1:%d/app", port)}, "", cmd...)
		require.Equal(t, 1, r.code, "%v", cmd)
		require.Equal(t, fmt.Sprintf("pgwake %s: cannot connect to PostgreSQL at 127.0.0.1:%d/app: connection refused; "+
			"set --database-url or PGWAKE_DATABASE_URL, or run `make demo` to try pgwake on a throwaway database\n", cmd[0], port), r.stderr)
		require.Empty(t, r.stdout)
	}

	// DATABASE_URL is the fallback; the password never shows.
	r := pgwakeEnv(t, []string{envFallbackURL + "=postgres://app:s3cr3t-pw@127.0.0.1:" + strconv.Itoa(port) + "/app"}, "", "stats")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "cannot connect to PostgreSQL at 127.0.0.1:")
	r = pgwakeEnv(t, nil, "", "stats", "--database-url", "postgres://app:s3cr3t pw@127.0.0.1/app")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "invalid database URL postgres://xxxxx@127.0.0.1/app")
	require.NotContains(t, r.stderr, "s3cr3t")

	r = pgwakeEnv(t, nil, "", "stats")
	require.Equal(t, 1, r.code)
	require.Equal(t, "pgwake stats: no database given: set --database-url or PGWAKE_DATABASE_URL, or run `make demo` to try pgwake on a throwaway database\n", r.stderr)

	// Not migrated.
	r = pgwake(t, "", "stats", "--schema", "pgwake_cli_not_there")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "pgwake's tables are missing in schema pgwake_cli_not_there")
	require.Contains(t, r.stderr, "run `pgwake migrate --schema pgwake_cli_not_there` first")
	r = pgwake(t, "", "worker", "--schema", "pgwake_cli_not_there", "--handler", "k=exec:true", "--metrics-addr", "off")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "run `pgwake migrate --schema pgwake_cli_not_there` first")
	// Migrated by an older pgwake: enqueue's function is missing.
	older := migrated(t)
	_, err = pgtest.Pool(t).Exec(context.Background(), `DROP FUNCTION `+sqlident.Quote(older, "enqueue_one")+`(text, jsonb, text, timestamptz, interval, integer, integer, jsonb, integer)`)
	require.NoError(t, err)
	r = pgwake(t, "", "enqueue", "--kind", "k", "--schema", older)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "run `pgwake migrate --schema "+older+"` first")

	// Migrated by an older pgwake: the migration it lacks is named.
	old := migrated(t)
	_, err = pgtest.Pool(t).Exec(context.Background(), `DELETE FROM `+sqlident.Quote(old, "schema_migrations")+
		` WHERE version = (SELECT max(version) FROM `+sqlident.Quote(old, "schema_migrations")+`)`)
	require.NoError(t, err)
	r = pgwake(t, "", "worker", "--schema", old, "--handler", "k=exec:true", "--metrics-addr", "off")
	require.Equal(t, 1, r.code)
	require.Regexp(t, "schema "+old+" lacks migration\\(s\\) [0-9]{4}; run `pgwake migrate --schema "+old+"` first", r.stderr)

	// Bad flags and commands: exit 2, one line, a pointer to help.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `pgwake: unknown command "frobnicate"; run ` + "`pgwake help`"},
		{[]string{"stats", "--bogus"}, "pgwake stats: flag provided but not defined: -bogus (see `pgwake stats --help`)"},
		{[]string{"worker"}, "give at least one --handler KIND=exec:COMMAND"},
		{[]string{"worker", "--handler", "k=./run.sh"}, "the handler must start with exec:"},
		{[]string{"worker", "--handler", "k=exec:true", "--concurrency", "0"}, "--concurrency 0 is outside 1..10000"},
		{[]string{"worker", "--handler", "k=exec:true", "--kind-timeout", "x=1s"}, `no --handler for kind "x"`},
		{[]string{"worker", "--handler", "k=exec:true", "--queues", "Bad"}, "--queues: invalid queue name"},
		{[]string{"stats", "--schema", "Robert'); DROP"}, "--schema: invalid schema name"},
		{[]string{"migrate", "sideways"}, `unknown action "sideways"`},
		{[]string{"jobs", "show", "abc"}, `job id "abc" is not a positive integer`},
		{[]string{"jobs", "list", "--state", "lost"}, `--state "lost"`},
		{[]string{"jobs", "--state", "failed", "list"}, "expected an action"}, // flags come after the action (docs/cli.md)
		{[]string{"stats", "--log-level", "loud"}, `--log-level "loud"`},
	} {
		r := pgwake(t, "", tc.args...)
		require.Equal(t, 2, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, "%v", tc.args)
		require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
	}

	// A busy metrics port is reported before anything starts.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	schema := migrated(t)
	r = pgwake(t, "", "worker", "--schema", schema, "--handler", "k=exec:true", "--metrics-addr", busy.Addr().String())
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "cannot serve metrics on "+busy.Addr().String())
	require.Contains(t, r.stderr, "address already in use")
}

func TestHelpEverywhere(t *testing.T) {
	t.Parallel()
	r := pgwake(t, "", "help")
	require.Equal(t, 0, r.code)
	for _, name := range commandNames() {
		require.Contains(t, r.stdout, "  "+name+" ")
		for _, args := range [][]string{{name, "--help"}, {name, "-h"}, {"help", name}} {
			r := pgwake(t, "", args...)
			require.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
			require.Contains(t, r.stdout, "Usage: pgwake "+name, "%v", args)
			require.Contains(t, r.stdout, "Example", "%v", args)
			require.Contains(t, r.stdout, "-database-url", "%v", args)
		}
	}
	r = pgwake(t, "")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "Usage: pgwake <command>")
}

func TestDemo(t *testing.T) {
	t.Parallel()
	r := pgwake(t, "", "demo", "--jobs", "150", "--rate", "500", "--metrics-addr", "127.0.0.1:0")
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	out := r.stdout
	require.Contains(t, out, "schema pgwake_demo_")
	require.Contains(t, out, "[##############################] 150/150 done")
	require.Regexp(t, `jobs\s+150 finished in \S+: \d+ jobs/s`, out)
	require.Regexp(t, `effects\s+(\d+) rows written in claim transactions for (\d+) succeeded jobs: exactly once`, out)
	require.Regexp(t, `p50 \S+\s+p90 \S+\s+p99 \S+\s+max \S+`, out)
	require.Regexp(t, `notify\s+\d+`, out)
	require.Regexp(t, `poll\s+\d+`, out)
	// The demo's schema is dropped.
	m := regexp.MustCompile(`schema (pgwake_demo_\w+)`).FindStringSubmatch(out)
	var exists bool
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, m[1]).Scan(&exists))
	require.False(t, exists)
}

func TestDemoWithoutServerBinaries(t *testing.T) {
	t.Parallel()
	r := pgwakeEnv(t, []string{"PGWAKE_PG_BIN=" + t.TempDir()}, "", "demo")
	require.Equal(t, 1, r.code)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), r.stderr)
	require.Contains(t, r.stderr, "pgwake demo: no database URL given")
	require.Contains(t, r.stderr, "apt-get install postgresql")
	require.Contains(t, r.stderr, "docker compose up")
}

func TestWorkerKilledTakesItsCommandAlong(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	id := enqueueID(t, "", "--schema", schema, "--kind", "stuck")
	w := startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "off",
		"--handler", fmt.Sprintf(`stuck=exec:echo $$ > %s.tmp && mv %s.tmp %s && exec sleep 600`, pidFile, pidFile, pidFile))
	var pid int
	waitFor(t, "the handler to start", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	w.signal(syscall.SIGKILL)
	w.wait()
	// Linux: the command gets SIGKILL when pgwake dies (Pdeathsig).
	waitFor(t, "the handler's process to die with the worker", func() bool { return processGone(pid) })
	waitFor(t, "the claim to roll back", func() bool {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), `SELECT count(*) FROM (SELECT id FROM `+
			sqlident.Quote(schema, "jobs")+` WHERE id = $1 FOR UPDATE SKIP LOCKED) s`, id).Scan(&n))
		return n == 1
	})
	j := getJob(t, schema, id)
	require.Equal(t, "pending", j.state)
	require.Equal(t, 0, j.attempts)
}

// processGone reports whether pid has exited (a zombie nobody reaped counts
// as gone: in a container, PID 1 may not reap orphans).
func processGone(pid int) bool {
	if syscall.Kill(pid, 0) == syscall.ESRCH {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) STATE ...; comm may hold spaces, so look after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func TestStatsWatch(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	enqueueID(t, "", "--schema", schema, "--kind", "k")
	p := startPgwake(t, "stats", "--watch", "--interval", "100ms", "--json", "--schema", schema)
	waitFor(t, "two refreshes", func() bool { return strings.Count(p.stdout.String(), "\n") >= 2 })
	p.signal(syscall.SIGINT)
	require.Equal(t, 0, p.wait())
	for _, line := range strings.Split(strings.TrimSpace(p.stdout.String()), "\n") {
		var doc statsDoc
		require.NoError(t, json.Unmarshal([]byte(line), &doc), line)
		require.Len(t, doc.Queues, 1)
		require.EqualValues(t, 1, doc.Queues[0].Pending)
	}
}

func TestDemoInterrupted(t *testing.T) {
	t.Parallel()
	p := startPgwake(t, "demo", "--jobs", "100000", "--rate", "200", "--metrics-addr", "off")
	waitFor(t, "the demo to start enqueuing", func() bool { return strings.Contains(p.stdout.String(), "done  enqueued") })
	p.signal(syscall.SIGTERM)
	require.Equal(t, 130, p.wait())
	require.Contains(t, p.stderr.String(), "pgwake demo: interrupted; the summary above covers the jobs finished so far\n")
	out := p.stdout.String()
	require.Contains(t, out, "Summary")
	m := regexp.MustCompile(`schema (pgwake_demo_\w+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	var exists bool
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, m[1]).Scan(&exists))
	require.False(t, exists, "the demo drops its schema when interrupted")
}

func TestWorkerCommandLeavingABackgroundProcess(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	id := enqueueID(t, "", "--schema", schema, "--kind", "daemon")
	// setsid: the leftover escapes the process group and keeps stderr open;
	// the job still succeeds once the command itself has exited.
	w := startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "off", "--job-timeout", "0",
		"--handler", fmt.Sprintf(`daemon=exec:setsid sh -c 'echo $$ > %s; exec sleep 600' & exit 0`, pidFile))
	waitState(t, schema, id, "succeeded")
	var pid int
	waitFor(t, "the leftover's pid", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	w.signal(syscall.SIGTERM)
	require.Equal(t, 0, w.wait())
}

// TestWorkerListenerURL: with --listener-url pointing nowhere (PgBouncer
// misconfigured, say), jobs still run through the poll fallback, and the
// metrics show it.
func TestWorkerListenerURL(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())

	w := startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "127.0.0.1:0", "--poll-interval", "100ms",
		"--listener-url", "postgres://u:secret-pw@"+closed+"/db", "--handler", "k=exec:true")
	addr := w.waitStderr(metricsRE)
	id := enqueueID(t, "", "--schema", schema, "--kind", "k")
	waitState(t, schema, id, "succeeded")
	_, body := httpGet(t, "http://"+addr+"/metrics")
	require.NotContains(t, body, `source="notify"`)
	// "busy" is also the last look a worker takes after marking itself idle:
	// a job enqueued just before it is claimed there, not by the poll.
	require.Regexp(t, `pgwake_worker_claims_total\{queue="default",source="(poll|recheck|start|busy)"\} 1`, body)
	w.signal(syscall.SIGTERM)
	require.Equal(t, 0, w.wait())
	require.NotContains(t, w.stderr.String(), "secret-pw", "the listener URL's password is never logged")

	r := pgwake(t, "", "worker", "--schema", schema, "--handler", "k=exec:true", "--listener-url", "postgres://u:secret-pw@[bad")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--listener-url postgres://")
	require.NotContains(t, r.stderr, "secret-pw")
}
