package ui_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// Retrying a failed job whose unique key another job now holds is a
// conflict of the job's state, not an outage: 409 naming the holder, as
// for a job not failed, and no event.
func TestRetryWithItsKeyHeldIsAConflict(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	bg := context.Background()
	worker, err := queue.New(pgtest.Pool(t), queue.Config{Schema: b.schema, Logger: zap.NewNop(),
		Queues: map[string]queue.QueueConfig{"work": {MaxWorkers: 1}},
		Handlers: map[string]queue.Handler{"bad": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			return errors.New("no")
		})}})
	require.NoError(t, err)
	stopWorker := pgtest.RunInBackground(t, "worker", worker.Run)
	a, err := b.client.Enqueue(bg, queue.NewJob{Queue: "work", Kind: "bad", UniqueKey: "r", MaxAttempts: 1})
	require.NoError(t, err)
	pgtest.WaitFor(t, 30*time.Second, "job failed", func() bool {
		j, err := b.client.JobGet(bg, a.ID)
		return err == nil && j.State == queue.StateFailed
	})
	stopWorker()
	holder, err := b.client.Enqueue(bg, queue.NewJob{Queue: "work", Kind: "bad", UniqueKey: "r"})
	require.NoError(t, err)
	require.False(t, holder.Duplicate)

	u := b.url + "/jobs/" + strconv.FormatInt(a.ID, 10)
	_, body := get(t, nil, u)
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(t, m, "the failed job's page has a retry form")
	code, body := postForm(t, u+"/retry", url.Values{"csrf": {m[1]}, "confirm": {"yes"}})
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "job "+strconv.FormatInt(holder.ID, 10), "names the holder")
	evs, err := b.client.JobEvents(bg, a.ID)
	require.NoError(t, err)
	require.Equal(t, queue.EventFailed, evs[len(evs)-1].Type, "no event written")
}
