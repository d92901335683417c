package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/queue"
)

// The unique flags reach the job, a period's holder says until when, and
// jobs retry --all-failed reports and skips a job whose key is held, retrying
// the others.
func TestEnqueueUniqueFlagsAndRetrySkip(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	ctx := context.Background()
	a := enqueueID(t, "", "--schema", schema, "--kind", "a", "--unique-key", "k", "--unique-scope", "queue")
	r := pgwake(t, "", "enqueue", "--schema", schema, "--kind", "b", "--unique-key", "k", "--unique-scope", "queue")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf("%d\n", a), r.stdout, "held by a in the queue scope")
	require.Contains(t, r.stderr, "1 of 1 jobs' unique keys were held")

	p := enqueueID(t, "", "--schema", schema, "--kind", "a", "--unique-key", "d", "--unique-period", "1h")
	r = pgwake(t, `{"kind":"a","unique_key":"d","unique_period":"1h"}`+"\n", "enqueue", "--schema", schema, "--batch")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf("%d\n", p), r.stdout)
	require.Regexp(t, fmt.Sprintf(`job 0: key held by job %d until \d{4}-`, p), r.stderr)

	r = pgwake(t, "", "enqueue", "--schema", schema, "--kind", "a", "--unique-key", "x", "--unique-hold", "forever")
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "unique_hold")

	// Two failed jobs with key "f"; another job holds "f" now.
	held := enqueueID(t, "", "--schema", schema, "--kind", "f", "--unique-key", "f")
	free := enqueueID(t, "", "--schema", schema, "--kind", "f")
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `UPDATE `+sqlident.Quote(schema, "jobs")+` SET state = 'failed', finished_at = now() WHERE id = ANY($1)`, []int64{held, free})
	require.NoError(t, err)
	holder := enqueueID(t, "", "--schema", schema, "--kind", "f", "--unique-key", "f")
	r = pgwake(t, "", "jobs", "retry", "--all-failed", "--schema", schema)
	require.Equal(t, 1, r.code)
	require.Equal(t, fmt.Sprintf("retried %d\n", free), r.stdout)
	require.Contains(t, r.stderr, fmt.Sprintf("skipped job %d: queue: retry job %d: its unique key is held by job %d", held, held, holder))
	require.Contains(t, r.stderr, "could not retry job(s) "+strconv.FormatInt(held, 10)+": their unique keys are held")
}

// jobs list and show print a job's unique key with its scope and hold, and
// its metadata, as text and as JSON; show prints when a period ends; a job
// without them prints none.
func TestJobsListShowUniqueAndMetadata(t *testing.T) {
	t.Parallel()
	schema := migrated(t)
	ctx := context.Background()
	plain := enqueueID(t, "", "--schema", schema, "--kind", "a")
	byQueue := enqueueID(t, "", "--schema", schema, "--kind", "a", "--unique-key", "q1", "--unique-scope", "queue", "--unique-hold", "succeeded")
	period := enqueueID(t, "", "--schema", schema, "--kind", "a", "--unique-key", "d1", "--unique-period", "1h")
	var traced int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT `+sqlident.Quote(schema, "enqueue")+
		`(kind => 'a', unique_key => 'k1', metadata => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "7"}')`).Scan(&traced))

	out := mustRun(t, "", "jobs", "list", "--schema", schema)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s.*\s-\s+-\s*$`, plain), out, "no key, no metadata")
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s.*\sq1 \(scope queue, hold succeeded\)\s+-`, byQueue), out)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s.*\sd1 \(scope kind, hold period\)\s+-`, period), out)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s.*\sk1 \(scope kind, hold active\)\s+tenant=7 traceparent=00-0af7`, traced), out)

	var page []jobRow
	require.NoError(t, json.Unmarshal([]byte(mustRun(t, "", "jobs", "list", "--schema", schema, "--json")), &page))
	got := map[int64]jobRow{}
	for _, j := range page {
		got[j.ID] = j
	}
	require.Equal(t, queue.UniqueByQueue, got[byQueue].UniqueScope)
	require.Equal(t, queue.UniqueHoldSucceeded, got[byQueue].UniqueHold)
	require.Equal(t, queue.UniqueHoldPeriod, got[period].UniqueHold)
	require.Equal(t, queue.UniqueHoldActive, got[traced].UniqueHold)
	require.Equal(t, map[string]string{"tenant": "7", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, got[traced].Metadata)
	require.Empty(t, got[plain].UniqueScope)
	require.Empty(t, got[plain].UniqueHold)
	require.Nil(t, got[plain].Metadata)

	out = mustRun(t, "", "jobs", "show", "--schema", schema, strconv.FormatInt(traced, 10))
	require.Contains(t, out, "  unique key:   k1 (scope kind, hold active)\n")
	require.Contains(t, out, "  metadata:     tenant=7\n                traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n")
	require.NotContains(t, out, "held until:")
	out = mustRun(t, "", "jobs", "show", "--schema", schema, strconv.FormatInt(period, 10))
	require.Contains(t, out, "  unique key:   d1 (scope kind, hold period)\n")
	require.Regexp(t, `\n  held until:   \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+\n`, out)
	var periodJob jobRow
	require.NoError(t, json.Unmarshal([]byte(mustRun(t, "", "jobs", "show", "--json", "--schema", schema, strconv.FormatInt(period, 10))), &periodJob))
	require.NotNil(t, periodJob.HeldUntil)
	require.Contains(t, out, "  held until:   "+periodJob.HeldUntil.Local().Format("2006-01-02 15:04:05.000 MST")+"\n")
	out = mustRun(t, "", "jobs", "show", "--schema", schema, strconv.FormatInt(plain, 10))
	require.NotContains(t, out, "held until:")
	require.NotContains(t, out, "unique key:")
	require.NotContains(t, out, "metadata:")
	var shown jobRow
	require.NoError(t, json.Unmarshal([]byte(mustRun(t, "", "jobs", "show", "--json", "--schema", schema, strconv.FormatInt(byQueue, 10))), &shown))
	require.Equal(t, "q1", shown.UniqueKey)
	require.Equal(t, queue.UniqueByQueue, shown.UniqueScope)
	require.Equal(t, queue.UniqueHoldSucceeded, shown.UniqueHold)
}
