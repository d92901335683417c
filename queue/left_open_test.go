package queue_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// A handler that returns with its rows not read to the end and not closed
// (a loop left early without rows.Close), a QueryRow it never scanned, or
// batch results it never closed: pgx keeps the connection busy until they
// are, and the job's completion (held: the batch's next job and commit)
// failed with "conn busy", at every attempt. pgwake closes them once the
// handler returned: each job succeeds once with its write; rows whose
// statement fails while they are closed fail that job only (its write
// rolled back), as a swallowed error does (ErrTxAborted).
func TestResultsLeftOpenAreClosed(t *testing.T) {
	t.Parallel()
	bothModes(t, func(t *testing.T, leased bool) {
		var schema string
		cfg := queue.Config{
			Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
			Handlers: map[string]queue.Handler{
				"x": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					if err := effect(ctx, tx, schema, j); err != nil {
						return err
					}
					var p struct{ How string }
					_ = json.Unmarshal(j.Payload, &p)
					switch p.How {
					case "rows":
						rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, 1000) g`)
						if err != nil {
							return err
						}
						rows.Next()
					case "row":
						_ = tx.QueryRow(ctx, `SELECT 1`)
					case "batch":
						b := &pgx.Batch{}
						b.Queue(`SELECT 1`)
						b.Queue(`SELECT 2`)
						_, err := tx.SendBatch(ctx, b).Exec()
						if err != nil {
							return err
						}
					case "failing":
						rows, err := tx.Query(ctx, `SELECT 1 / (g - 500) FROM generate_series(1, 1000) g`)
						if err != nil {
							return err
						}
						rows.Next()
					case "closed":
						// Read and closed as it should be: nothing left.
						rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, 3) g`)
						if err != nil {
							return err
						}
						_, err = pgx.CollectRows(rows, pgx.RowTo[int32])
						return err
					}
					return nil
				}),
			},
		}
		if leased {
			cfg.LeasedKinds = []string{"x"}
		}
		e := newEnvOwnPool(t, 6, cfg)
		schema = e.schema
		hows := []string{"rows", "row", "batch", "closed", "failing"}
		var jobs []queue.NewJob
		for i := range 25 {
			jobs = append(jobs, queue.NewJob{Kind: "x", Payload: map[string]string{"How": hows[i%len(hows)]}, MaxAttempts: 1})
		}
		ids := e.enqueueIDs(jobs...)
		e.run()
		waitFor(t, 30*time.Second, "every job finished", func() bool {
			return e.count(`state IN ('succeeded', 'failed')`) == len(ids)
		})
		require.Equal(t, 20, e.count(`state = 'succeeded' AND attempts = 1 AND payload->>'How' <> 'failing'`))
		require.Equal(t, 5, e.count(`state = 'failed' AND payload->>'How' = 'failing'`))
		require.Equal(t, 20, e.countSQL(`SELECT count(DISTINCT job_id) FROM `+e.schema+`.effects`), "every write but the failing jobs' committed")
		require.Zero(t, e.countSQL(`SELECT count(*) FROM `+e.schema+`.effects f JOIN `+e.schema+`.jobs j ON j.id = f.job_id WHERE j.payload->>'How' = 'failing'`))
	})
}
