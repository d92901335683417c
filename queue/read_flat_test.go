package queue

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
)

// QueueStats reads about as many buffers at 300,000 pending jobs as at
// 30,000 (10 queues, 3 priorities, a quarter scheduled ahead, plus failed
// and succeeded jobs): its counts stop at the exact limit, the rest comes
// from index ranges. The statement it replaced (pgwake stats until
// migration 0015) read every pending row: its buffers grew with the table.
func TestQueueStatsCostIsFlat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil)
	measure := func(n int) int64 {
		schema, jobs := flatSchema(t, pool)
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO `+jobs+` (queue, kind, priority, run_after)
			SELECT 'q' || (i %% 10), 'k', (i %% 3)::smallint,
				CASE WHEN i %% 4 = 0 THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END
			FROM generate_series(1, %d) i`, n))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO `+jobs+` (queue, kind, state, finished_at, last_error)
			SELECT 'q' || (i %% 10), 'k', CASE WHEN i %% 2 = 0 THEN 'failed' ELSE 'succeeded' END,
				now() - (i %% 120) * interval '1 second', 'boom'
			FROM generate_series(1, %d) i`, n/2))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `VACUUM ANALYZE `+jobs)
		require.NoError(t, err)
		s := newStatements(schema)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer rollback(tx)
		buffers, rows := explainBuffers(t, tx, s.read.stats, `1001`)
		require.Equal(t, int64(10), rows)
		return buffers
	}
	small, large := measure(30000), measure(300000)
	t.Logf("QueueStats buffers: %d at 30,000 pending, %d at 300,000", small, large)
	require.Less(t, float64(large), 1.5*float64(small)+50, "cost grows with the table")
}
