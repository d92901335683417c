package ui_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// On a filtered jobs page, "new jobs: N" counts only new jobs that the
// filter would list: jobs enqueued on other queues or of other kinds are
// not announced (clicking "show" would not list them).
func TestBrowserNewJobsCountFollowsTheFilter(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{})
	bg := context.Background()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/jobs?queue=wanted&kind=k")))
	waitLive(t, ctx)
	var want []int64
	for i, nj := range []queue.NewJob{
		{Queue: "wanted", Kind: "k"}, {Queue: "other", Kind: "k"}, {Queue: "wanted", Kind: "other"},
		{Queue: "other", Kind: "x"}, {Queue: "wanted", Kind: "k", RunAfter: time.Now().Add(time.Hour)},
	} {
		r, err := b.client.Enqueue(bg, nj)
		require.NoError(t, err, i)
		want = append(want, r.ID)
	}
	last, err := b.client.LastEventID(bg)
	require.NoError(t, err)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`window.pgwakeStream.jobs.includes(`+strconv.FormatInt(last, 10)+`)`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the page received every enqueue")
	n, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#new-jobs span")))
	require.NoError(t, err)
	require.Equal(t, "2", n, "only jobs of queue wanted and kind k are new on this page")

	// A page filtered on failed jobs, or on an error text, lists no new job.
	for _, q := range []string{"?state=failed", "?error=boom", "?state=succeeded&queue=wanted"} {
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/jobs"+q)))
		waitLive(t, ctx)
		r, err := b.client.Enqueue(bg, queue.NewJob{Queue: "wanted", Kind: "k"})
		require.NoError(t, err)
		_ = r
		last, err := b.client.LastEventID(bg)
		require.NoError(t, err)
		_, err = chromedp.Run(ctx, chromedp.Poll[bool](`window.pgwakeStream.jobs.includes(`+strconv.FormatInt(last, 10)+`)`,
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err)
		hidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("new-jobs").hidden`))
		require.NoError(t, err)
		require.True(t, hidden, "a new pending job is not announced on %s", q)
	}
}
