package ui_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// The jobs page is read after its resume point, so the stream replays the
// enqueued events of jobs the page already lists (the feed's resume point
// lags the commits: a read every 50 ms, or an open transaction's skipped
// id). Those are not "new jobs": only jobs the page does not show count.
func TestBrowserListedJobsAreNotNew(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{})
	bg := context.Background()
	// An open transaction holds an event id back: the resume point stays
	// below the jobs committed after it.
	tx, err := pgtest.Pool(t).Begin(bg)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(bg) }()
	_, err = b.client.EnqueueTx(bg, tx, queue.NewJob{Queue: "held", Kind: "k"})
	require.NoError(t, err)
	r, err := b.client.Enqueue(bg, queue.NewJob{Queue: "shown", Kind: "k"})
	require.NoError(t, err)
	last, err := b.client.LastEventID(bg)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/jobs")))
	waitLive(t, ctx)
	after, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`Number(document.body.dataset.after)`))
	require.NoError(t, err)
	require.Less(t, int64(after), last, "the page's resume point is below the listed job's event (the open transaction holds it back)")
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`window.pgwakeStream.jobs.includes(`+strconv.FormatInt(last, 10)+`)`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the page received the listed job's enqueued event")
	listed, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('tr[data-job-id="`+strconv.FormatInt(r.ID, 10)+`"]') !== null`))
	require.NoError(t, err)
	require.True(t, listed, "the page lists the job")
	hidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("new-jobs").hidden`))
	require.NoError(t, err)
	require.True(t, hidden, "a listed job is not announced as new")
}
