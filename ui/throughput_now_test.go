package ui_test

import (
	"context"
	"strings"
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

// The throughput and latency "now" figures are those of the last seconds:
// once jobs stop, they read 0, not the last busy second's figure for ever
// (the feed keeps up to 120 busy seconds, however old).
func TestBrowserThroughputNowFallsToZero(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{RefreshInterval: 500 * time.Millisecond})
	worker, err := queue.New(pgtest.Pool(t), queue.Config{Schema: b.schema, Logger: zap.NewNop(),
		Queues: map[string]queue.QueueConfig{"work": {MaxWorkers: 4}},
		Handlers: map[string]queue.Handler{"ok": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			return nil
		})}})
	require.NoError(t, err)
	stopWorker := pgtest.RunInBackground(t, "worker", worker.Run)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/")))
	waitLive(t, ctx)
	jobs := make([]queue.NewJob, 20)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: "work", Kind: "ok"}
	}
	_, err = b.client.EnqueueMany(context.Background(), jobs)
	require.NoError(t, err)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`!document.getElementById("throughput-now").textContent.startsWith("0/s") &&
		document.getElementById("throughput-now").textContent !== "-"`, chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the page shows the jobs' throughput")
	stopWorker()
	time.Sleep(3500 * time.Millisecond) // quiet: no success for 3 s
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("throughput-now").textContent.startsWith("0/s")`,
		chromedp.WithPollingTimeout(5*time.Second)))
	if err != nil {
		now, _ := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#throughput-now")))
		lat, _ := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#latency-now")))
		t.Fatalf("3 s after the last success the page shows throughput %q, latency %q", strings.TrimSpace(now), strings.TrimSpace(lat))
	}
	lat, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#latency-now")))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(lat, "0 ms"), "latency now %q", lat)
}
