package ui_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
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

// browser opens a headless Chromium tab (the Debian chromium package, which
// scripts/install-test-clients.sh installs) for the test; it skips the test
// when none is installed.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("no chromium on PATH: run scripts/install-test-clients.sh (Debian package chromium) to run the browser tests")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	tctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancelTab(); cancelAlloc() })
	return tctx
}

// waitLive waits until the page's event stream is open.
func waitLive(t *testing.T, ctx context.Context) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("live").textContent === "live"`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "event stream open")
}

// screenshot saves the page as name in $PGWAKE_UI_SCREENSHOTS, when set
// (docs/ui.md's pictures).
func screenshot(t *testing.T, ctx context.Context, name string) {
	dir := os.Getenv("PGWAKE_UI_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
}

// The overview's counters move without a reload after enqueues from Go:
// for each of 20 enqueues, the time from its commit to the cell's change in
// the page (both on this machine's clock) is logged, median and max.
func TestBrowserOverviewCountersMoveLive(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{RefreshInterval: time.Hour}) // only notifications move the page
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/")))
	waitLive(t, ctx)
	_, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`window.__loaded = true`))
	require.NoError(t, err)
	var lat []float64
	for i := 1; i <= 20; i++ {
		_, err := b.client.Enqueue(context.Background(), queue.NewJob{Queue: "live", Kind: "k"})
		require.NoError(t, err)
		committed := time.Now().UnixMicro()
		changed, err := chromedp.Run(ctx, chromedp.Poll[float64](fmt.Sprintf(`(() => {
			const td = document.querySelector('tr[data-queue="live"] [data-field="pending"]');
			return td && td.textContent === "%d" && Number(td.dataset.changedAt);
		})()`, i), chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "pending reaches %d without reload", i)
		lat = append(lat, max(changed-float64(committed)/1000, 0))
	}
	loaded, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__loaded === true`))
	require.NoError(t, err)
	require.True(t, loaded, "the page was not reloaded")
	slices.Sort(lat)
	t.Logf("commit to DOM update over %d enqueues: median %.0f ms, max %.0f ms", len(lat), lat[len(lat)/2], lat[len(lat)-1])
	screenshot(t, ctx, "ui-overview.png")
}

// A payload holding markup is shown as text: no element is created from it
// and no script of it runs.
func TestBrowserHostilePayloadIsText(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{})
	hostile := `<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">`
	r, err := b.client.Enqueue(context.Background(), queue.NewJob{Kind: "k", Payload: map[string]string{"html": hostile}})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/jobs/"+strconv.FormatInt(r.ID, 10))))
	text, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#payload")))
	require.NoError(t, err)
	require.Contains(t, text, `<script>window.__pwned = 1</script>`)
	children, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.getElementById("payload").children.length`))
	require.NoError(t, err)
	require.Zero(t, children)
	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__pwned !== undefined`))
	require.NoError(t, err)
	require.False(t, pwned)
}

// A failed job retried from its page succeeds, and the page shows it
// without a reload; a pending job cancelled from its page is cancelled.
// Both write their events.
func TestBrowserRetryAndCancel(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{})
	var fail atomic.Bool
	fail.Store(true)
	worker, err := queue.New(pgtest.Pool(t), queue.Config{Schema: b.schema, Logger: zap.NewNop(),
		Queues: map[string]queue.QueueConfig{"work": {MaxWorkers: 1}},
		Handlers: map[string]queue.Handler{"flaky": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			if fail.Load() {
				return errors.New("upstream said no\n\tat flaky.go:12")
			}
			return nil
		})}})
	require.NoError(t, err)
	pgtest.RunInBackground(t, "worker", worker.Run)
	bg := context.Background()
	r, err := b.client.Enqueue(bg, queue.NewJob{Queue: "work", Kind: "flaky", MaxAttempts: 1, Payload: map[string]any{"to": "a@example.com", "n": 3}})
	require.NoError(t, err)
	pgtest.WaitFor(t, 30*time.Second, "job failed", func() bool {
		j, err := b.client.JobGet(bg, r.ID)
		return err == nil && j.State == queue.StateFailed
	})
	fail.Store(false)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/jobs/"+strconv.FormatInt(r.ID, 10))))
	text, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#last-error")))
	require.NoError(t, err)
	require.Contains(t, text, "at flaky.go:12", "the error with its stack")
	screenshot(t, ctx, "ui-job.png")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#retry")), chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#events"))))
	waitLive(t, ctx)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("state").textContent === "succeeded"`,
		chromedp.WithPollingTimeout(30*time.Second)))
	if err != nil {
		j, _ := b.client.JobGet(bg, r.ID)
		shown, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("state").textContent + " after=" + document.body.dataset.after + " seen=" + JSON.stringify(window.pgwakeStream.jobs)`))
		t.Fatalf("the page does not show the retried job succeed: job %s, page %s", j.State, shown)
	}
	evs, err := b.client.JobEvents(bg, r.ID)
	require.NoError(t, err)
	var types []queue.EventType
	for _, e := range evs {
		types = append(types, e.Type)
	}
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventFailed, queue.EventRetried, queue.EventSucceeded}, types)

	c, err := b.client.Enqueue(bg, queue.NewJob{Queue: "elsewhere", Kind: "k"})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/jobs/"+strconv.FormatInt(c.ID, 10)),
		chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#events"))))
	state, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#state")))
	require.NoError(t, err)
	require.Equal(t, string(queue.StateCancelled), state)
	evs, err = b.client.JobEvents(bg, c.ID)
	require.NoError(t, err)
	require.Equal(t, queue.EventCancelled, evs[len(evs)-1].Type)
}

// A read-only dashboard shows no action and refuses a forged one.
func TestBrowserReadOnly(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{ReadOnly: true})
	r, err := b.client.Enqueue(context.Background(), queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	id := strconv.FormatInt(r.ID, 10)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/")))
	waitLive(t, ctx)
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("form[method=post], button").length`))
	require.NoError(t, err)
	require.Zero(t, n, "no action on the overview")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/jobs/"+id)))
	n, err = chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("form[method=post], #cancel, #retry").length`))
	require.NoError(t, err)
	require.Zero(t, n, "no action on the job page")
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`fetch("cancel".replace(/^/, location.pathname + "/"),
		{method: "POST", body: new URLSearchParams({confirm: "yes"})}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, 403, status)
	j, err := b.client.JobGet(context.Background(), r.ID)
	require.NoError(t, err)
	require.Equal(t, queue.StatePending, j.State)
}

// With a token (what a non-loopback bind requires), the browser is refused
// without it, and with ?token= once gets the pages and the live stream.
func TestBrowserTokenRequired(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{Token: "t0ken"})
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/")))
	body, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.textContent`))
	require.NoError(t, err)
	require.Contains(t, body, "a token is required")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/?token=t0ken")))
	waitLive(t, ctx)
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.NotContains(t, loc, "token", "the token leaves the address bar")
}

// The page's one event stream, cut by the server, reconnects by itself
// with Last-Event-ID and receives every event it missed: the ids it saw
// have no gap.
func TestBrowserStreamResumesWithoutGaps(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{})
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/")))
	waitLive(t, ctx)
	bg := context.Background()
	first, err := b.client.LastEventID(bg)
	require.NoError(t, err)
	enqueue := func(n int) {
		jobs := make([]queue.NewJob, n)
		for i := range jobs {
			jobs[i] = queue.NewJob{Kind: "k"}
		}
		_, err := b.client.EnqueueMany(bg, jobs)
		require.NoError(t, err)
	}
	waitSeen := func(n int) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`new Set(window.pgwakeStream.jobs).size >= %d`, n),
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "the page saw %d events", n)
	}
	enqueue(10)
	waitSeen(10)
	for i := range 3 {
		b.srv.CloseClientConnections() // the stream drops
		for range 5 {
			enqueue(4) // while it reconnects
		}
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`window.pgwakeStream.opens >= %d`, i+2),
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "reconnect %d", i+1)
	}
	enqueue(7)
	waitSeen(10 + 3*20 + 7)
	ids, err := chromedp.Run(ctx, chromedp.Evaluate[[]int64](`Array.from(new Set(window.pgwakeStream.jobs)).sort((a, b) => a - b)`))
	require.NoError(t, err)
	var want []int64
	for id := first + 1; id <= first+77; id++ {
		want = append(want, id)
	}
	require.Equal(t, want, ids)
	opens, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.pgwakeStream.opens`))
	require.NoError(t, err)
	require.Equal(t, 4, opens, "one stream, reopened after each of the 3 cuts")
}

// A page refused a stream (Config.MaxStreams reached: 503, which ends an
// EventSource for good) opens a new one later, from the resume point it was
// read at, and gets what committed meanwhile.
func TestBrowserRefusedStreamOpensLater(t *testing.T) {
	ctx := browser(t)
	b := setup(t, ui.Config{MaxStreams: 1})
	sctx, closeOther := context.WithCancel(context.Background())
	defer closeOther()
	other := stream(t, sctx, b.url+"/events", "") // holds the only place
	select {
	case <-other:
	case <-time.After(30 * time.Second):
		t.Fatal("the first stream did not open")
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+"/")))
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](`window.pgwakeStream && window.pgwakeStream.source.readyState === EventSource.CLOSED`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the page's stream was refused")
	jobs := make([]queue.NewJob, 5)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "k"}
	}
	_, err = b.client.EnqueueMany(context.Background(), jobs)
	require.NoError(t, err)
	closeOther()
	waitLive(t, ctx)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`new Set(window.pgwakeStream.jobs).size >= 5`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err, "the page got the events committed while it had no stream")
	opens, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.pgwakeStream.opens`))
	require.NoError(t, err)
	require.Equal(t, 1, opens)
}
