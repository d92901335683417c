package ui_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// The job page's actions follow the state the stream shows, as a reload
// would offer them: a job that fails while its page is open gets Retry
// (and loses Cancel); one cancelled elsewhere loses Cancel.
func TestBrowserJobActionsFollowItsState(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{})
	bg := context.Background()
	buttons := func() string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`["retry", "cancel"].filter((id) => document.getElementById(id)).join(",")`))
		require.NoError(t, err)
		return s
	}
	waitButtons := func(want, why string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](`["retry", "cancel"].filter((id) => document.getElementById(id)).join(",") === "`+want+`"`,
			chromedp.WithPollingTimeout(20*time.Second)))
		require.NoError(t, err, "%s: buttons %q, want %q", why, buttons(), want)
	}

	c, err := b.client.Enqueue(bg, queue.NewJob{Queue: "idle", Kind: "k"})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/jobs/"+strconv.FormatInt(c.ID, 10))))
	waitLive(t, ctx)
	require.Equal(t, "cancel", buttons())
	require.NoError(t, b.client.Cancel(bg, c.ID))
	waitButtons("", "cancelled elsewhere")

	f, err := b.client.Enqueue(bg, queue.NewJob{Queue: "work", Kind: "bad", MaxAttempts: 1})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/jobs/"+strconv.FormatInt(f.ID, 10))))
	waitLive(t, ctx)
	require.Equal(t, "cancel", buttons())
	worker, err := queue.New(pgtest.Pool(t), queue.Config{Schema: b.schema, Logger: zap.NewNop(),
		Queues: map[string]queue.QueueConfig{"work": {MaxWorkers: 1}},
		Handlers: map[string]queue.Handler{"bad": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			return errors.New("no")
		})}})
	require.NoError(t, err)
	pgtest.RunInBackground(t, "worker", worker.Run)
	waitButtons("retry", "failed while open")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#retry")), chromedp.WaitVisible(chromedp.CSS("#confirm"))))
}
