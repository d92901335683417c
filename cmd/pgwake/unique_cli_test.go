package main

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
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
