package ui_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func postForm(t *testing.T, u string, form url.Values) (int, string) {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.PostForm(u, form)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// A hostile payload, queue name and error are escaped on every page; the
// payload is cut at PayloadLimit.
func TestPagesEscapeHostileValues(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{Prefix: "/pgwake", PayloadLimit: 200})
	ctx := context.Background()
	r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: `<img/src=x/onerror=alert(1)>`,
		Payload: map[string]string{"x": "</pre><script>alert(1)</script>", "pad": strings.Repeat("a", 500)}})
	require.NoError(t, err)
	for _, path := range []string{"/", "/jobs", "/jobs/" + strconv.FormatInt(r.ID, 10), "/jobs?queue=%3Cscript%3E"} {
		code, body := get(t, nil, b.url+path)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, body, "<script>alert", path)
		require.NotContains(t, body, "<img/src=x", path)
	}
	_, body := get(t, nil, b.url+"/jobs/"+strconv.FormatInt(r.ID, 10))
	require.Contains(t, body, "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;")
	require.Contains(t, body, "Payload cut at 200 bytes")
}

// Actions need the page's form token and a confirmation; a read-only
// dashboard shows none and refuses them; each action writes its event.
func TestActionsCSRFConfirmReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	jobURL := b.url + "/jobs/" + strconv.FormatInt(r.ID, 10)
	_, body := get(t, nil, jobURL)
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(t, m, "the job page has a cancel form")
	code, _ := postForm(t, jobURL+"/cancel", url.Values{"confirm": {"yes"}})
	require.Equal(t, http.StatusForbidden, code, "no token")
	wrong := "0"
	if m[1][0] == '0' {
		wrong = "1"
	}
	code, _ = postForm(t, jobURL+"/cancel", url.Values{"confirm": {"yes"}, "csrf": {wrong + m[1][1:]}})
	require.Equal(t, http.StatusForbidden, code, "wrong token")
	code, body = postForm(t, jobURL+"/cancel", url.Values{"csrf": {m[1]}})
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Really cancel job")
	j, err := b.client.JobGet(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, queue.StatePending, j.State, "not without confirmation")
	code, _ = postForm(t, jobURL+"/cancel", url.Values{"csrf": {m[1]}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, code)
	evs, err := b.client.JobEvents(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, queue.EventCancelled, evs[len(evs)-1].Type)

	// Pause and resume through the API.
	code, _ = postForm(t, b.url+"/queues/default/pause", url.Values{"csrf": {m[1]}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, code)
	qs, err := b.client.Queues(ctx)
	require.NoError(t, err)
	require.True(t, qs[0].Paused)

	ro := setup(t, ui.Config{ReadOnly: true})
	r2, err := ro.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	ro2URL := ro.url + "/jobs/" + strconv.FormatInt(r2.ID, 10)
	_, body = get(t, nil, ro2URL)
	require.NotContains(t, body, `name="csrf"`)
	require.NotContains(t, body, `id="cancel"`)
	code, _ = postForm(t, ro2URL+"/cancel", url.Values{"confirm": {"yes"}})
	require.Equal(t, http.StatusForbidden, code)
	j, err = ro.client.JobGet(ctx, r2.ID)
	require.NoError(t, err)
	require.Equal(t, queue.StatePending, j.State)
}

// With a token, every request without it is refused; ?token= sets a cookie.
func TestTokenRequired(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{Token: "s3cret"})
	code, _ := get(t, nil, b.url+"/")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(t, nil, b.url+"/events")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(t, nil, b.url+"/?token=wrong")
	require.Equal(t, http.StatusUnauthorized, code)
	req, err := http.NewRequest(http.MethodGet, b.url+"/api/stats", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	jar := &cookieJar{}
	c := &http.Client{Jar: jar}
	code, body := get(t, c, b.url+"/jobs?token=s3cret")
	require.Equal(t, http.StatusOK, code, body)
	code, _ = get(t, c, b.url+"/jobs")
	require.Equal(t, http.StatusOK, code, "the cookie carries the token")
}

// The ?token= visit's redirect stays on the dashboard's site: a path
// "//other.host/x" (a link someone could send with a valid token) went on
// to other.host. Behind a proxy that ends TLS (X-Forwarded-Proto: https)
// the token's cookie is Secure. Before, it was Secure only on a direct TLS
// connection.
func TestTokenRedirectStaysOnSite(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{Token: "s3cret", Prefix: "/pgwake"})
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	visit := func(path string, hdr map[string]string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, b.url[:len(b.url)-len("/pgwake")]+path, nil)
		require.NoError(t, err)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := noFollow.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	for _, path := range []string{"//other.example/x?token=s3cret", "/\\other.example/x?token=s3cret"} {
		resp := visit(path, nil)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, path)
		require.Equal(t, "/pgwake/", resp.Header.Get("Location"), path)
	}
	resp := visit("/pgwake/jobs?state=failed&token=s3cret", nil)
	require.Equal(t, "/pgwake/jobs?state=failed", resp.Header.Get("Location"), "an ordinary visit keeps its page")
	require.False(t, resp.Cookies()[0].Secure, "plain HTTP, no proxy")
	resp = visit("/pgwake/?token=s3cret", map[string]string{"X-Forwarded-Proto": "https"})
	require.Len(t, resp.Cookies(), 1)
	require.True(t, resp.Cookies()[0].Secure)
}

// /static/ serves the page's files, not a listing of them.
func TestStaticListsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	code, _ := get(t, nil, b.url+"/static/")
	require.Equal(t, http.StatusNotFound, code)
	code, body := get(t, nil, b.url+"/static/style.css")
	require.Equal(t, http.StatusOK, code)
	require.NotEmpty(t, body)
}

// Bad filters answer 400 with the reason and run no query.
func TestJobsPageBadFilter(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	code, body := get(t, nil, b.url+"/jobs?state=exploded")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "bad filter State")
	code, _ = get(t, nil, b.url+"/jobs?before=x")
	require.Equal(t, http.StatusBadRequest, code)
}

// sseEvent is one parsed server-sent event.
type sseEvent struct {
	event, id, data string
}

// stream reads server-sent events from u (with Last-Event-ID when last is
// not empty) into a channel until ctx ends.
func stream(t testing.TB, ctx context.Context, u, last string) <-chan sseEvent {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	require.NoError(t, err)
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	out := make(chan sseEvent, 100000)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var e sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if e.event != "" {
					out <- e
				}
				e = sseEvent{}
			case strings.HasPrefix(line, "event: "):
				e.event = line[7:]
			case strings.HasPrefix(line, "id: "):
				e.id = line[4:]
			case strings.HasPrefix(line, "data: "):
				e.data = line[6:]
			}
		}
	}()
	return out
}

// A stream that reconnects with the last id it saw gets every event it
// missed while away, then the live ones: no event id is missing.
func TestStreamResumesWithoutGaps(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	seen := map[int64]bool{}
	last := ""
	take := func(ch <-chan sseEvent, want int) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for len(seen) < want {
			select {
			case e, ok := <-ch:
				require.True(t, ok, "stream ended")
				if e.id != "" {
					last = e.id
				}
				if e.event == "job" {
					var je struct {
						ID int64 `json:"id"`
					}
					require.NoError(t, json.Unmarshal([]byte(e.data), &je))
					seen[je.ID] = true
				}
			case <-deadline:
				t.Fatalf("saw %d of %d events", len(seen), want)
			}
		}
	}
	enqueue := func(n int) {
		jobs := make([]queue.NewJob, n)
		for i := range jobs {
			jobs[i] = queue.NewJob{Kind: "k"}
		}
		_, err := b.client.EnqueueMany(ctx, jobs)
		require.NoError(t, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	ch := stream(t, sctx, b.url+"/events", "")
	// The first stream is open once its first mark or stats arrives.
	enqueue(10)
	take(ch, 10)
	cancel()
	enqueue(25) // while away
	for i := range 5 {
		_, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k", Payload: map[string]int{"i": i}})
		require.NoError(t, err)
	}
	require.NotEmpty(t, last)
	sctx, cancel = context.WithCancel(ctx)
	defer cancel()
	ch = stream(t, sctx, b.url+"/events", last)
	take(ch, 40)
	enqueue(3) // live again
	take(ch, 43)
	lastID, err := b.client.LastEventID(ctx)
	require.NoError(t, err)
	for id := lastID - 42; id <= lastID; id++ {
		require.True(t, seen[id], "event %d", id)
	}
}

// Counters are pushed after an enqueue, without the page asking; the feed
// reads the counters once per notification burst, not once per page.
func TestStatsPushedAfterEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{RefreshInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var chans []<-chan sseEvent
	for range 3 {
		chans = append(chans, stream(t, ctx, b.url+"/events", ""))
	}
	_, err := b.client.EnqueueMany(ctx, []queue.NewJob{{Kind: "k", Queue: "live"}, {Kind: "k", Queue: "live"}})
	require.NoError(t, err)
	for _, ch := range chans {
		pgtest.WaitFor(t, 30*time.Second, "stats with the queue", func() bool {
			for {
				select {
				case e, ok := <-ch:
					require.True(t, ok, "the stream ended")
					if e.event == "stats" && strings.Contains(e.data, `"queue":"live","pending":2`) {
						return true
					}
				default:
					return false
				}
			}
		})
	}
}

type cookieJar struct{ cookies []*http.Cookie }

func (j *cookieJar) SetCookies(_ *url.URL, cs []*http.Cookie) { j.cookies = append(j.cookies, cs...) }
func (j *cookieJar) Cookies(*url.URL) []*http.Cookie          { return j.cookies }

// An event whose transaction is still open holds the resume point back; a
// stream that connects meanwhile still gets the later events the feed had
// already sent (from the event log), then the held one when it commits.
func TestStreamAcrossAnOpenTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	_, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch0 := stream(t, sctx, b.url+"/events", "")
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	held, err := b.client.EnqueueTx(ctx, tx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	later, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	jobIDs := func(ch <-chan sseEvent, want ...int64) string {
		t.Helper()
		got := map[int64]bool{}
		last := ""
		pgtest.WaitFor(t, 30*time.Second, "events of the jobs", func() bool {
			for {
				select {
				case e, ok := <-ch:
					require.True(t, ok, "the stream ended")
					if e.id != "" {
						last = e.id
					}
					if e.event == "job" {
						var je struct {
							JobID int64 `json:"job_id"`
						}
						require.NoError(t, json.Unmarshal([]byte(e.data), &je))
						got[je.JobID] = true
					}
				default:
					for _, id := range want {
						if !got[id] {
							return false
						}
					}
					return true
				}
			}
		})
		return last
	}
	last := jobIDs(ch0, later.ID) // the feed has sent the later event
	// A new stream resuming from the held-back point.
	ch := stream(t, sctx, b.url+"/events", last)
	jobIDs(ch, later.ID)
	require.NoError(t, tx.Commit(ctx))
	jobIDs(ch, held.ID)
}

// Without a token, a request naming another host (DNS rebinding) is refused.
func TestNoTokenRefusesHostNames(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	req, err := http.NewRequest(http.MethodGet, b.url+"/", nil)
	require.NoError(t, err)
	req.Host = "attacker.example:8080"
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	req.Host = "localhost:8080"
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// Pages carry a Content-Security-Policy with no inline script and no
// framing; an action posted from another origin is refused even with the
// page's form token.
func TestCSPAndCrossOriginActions(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	jobURL := b.url + "/jobs/" + strconv.FormatInt(r.ID, 10)
	resp, err := http.Get(jobURL)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	csp := resp.Header.Get("Content-Security-Policy")
	require.Contains(t, csp, "script-src 'self'")
	require.Contains(t, csp, "frame-ancestors 'none'")
	require.NotContains(t, csp, "unsafe-inline")
	m := csrfRe.FindStringSubmatch(string(body))
	require.NotNil(t, m)

	for _, hdr := range []map[string]string{{"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}} {
		req, err := http.NewRequest(http.MethodPost, jobURL+"/cancel",
			strings.NewReader(url.Values{"csrf": {m[1]}, "confirm": {"yes"}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%v", hdr)
	}
	j, err := b.client.JobGet(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, queue.StatePending, j.State, "a cross-origin action changed nothing")
}

// The counters' successes of the last minute are counted by the feed: the
// ones before it started from the event log once, the later ones as it
// reads them, so its counter reads skip that count; a queue that only
// recent successes name is still listed.
func TestSucceededLastMinuteCountedByTheFeed(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaOn(t, pool)
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	worker, err := queue.New(pool, queue.Config{Schema: schema, Logger: zap.NewNop(),
		Queues:   map[string]queue.QueueConfig{"done": {MaxWorkers: 2}, "only": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })}})
	require.NoError(t, err)
	pgtest.RunInBackground(t, "worker", worker.Run)
	succeeded := func(q string, n int64) {
		pgtest.WaitFor(t, 30*time.Second, "jobs succeeded", func() bool {
			st, err := worker.QueueStats(ctx, queue.QueueStatsParams{})
			require.NoError(t, err)
			for _, s := range st {
				if s.Queue == q {
					return s.SucceededLastMinute == n && s.Pending == 0 && s.Running == 0
				}
			}
			return false
		})
	}
	enqueue := func(q string, n int) {
		for range n {
			_, err := worker.Enqueue(ctx, queue.NewJob{Queue: q, Kind: "k"})
			require.NoError(t, err)
		}
	}
	enqueue("done", 5)
	succeeded("done", 5)

	b := setup(t, ui.Config{Client: worker, RefreshInterval: time.Hour})
	ch := stream(t, ctx, b.url+"/events", "")
	counts := func(want map[string]int64) {
		pgtest.WaitFor(t, 30*time.Second, fmt.Sprintf("counters %v", want), func() bool {
			for {
				select {
				case e, ok := <-ch:
					require.True(t, ok, "the stream ended")
					if e.event != "stats" {
						continue
					}
					var m struct{ Queues []queue.QueueStat }
					require.NoError(t, json.Unmarshal([]byte(e.data), &m))
					got := map[string]int64{}
					for _, s := range m.Queues {
						got[s.Queue] = s.SucceededLastMinute
					}
					if maps.Equal(got, want) {
						return true
					}
				default:
					return false
				}
			}
		})
	}
	counts(map[string]int64{"done": 5})
	enqueue("done", 3)
	enqueue("only", 2)
	succeeded("done", 8)
	succeeded("only", 2)
	counts(map[string]int64{"done": 8, "only": 2})
}

// A job's page shows its newest 500 events and says older ones exist: a
// job that snoozed or retried thousands of times made a page of every
// event, read and rendered at once (85 MB for 20,000 events with errors).
func TestJobPageShowsTheNewestEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	_, err = b.client.Pool().Exec(ctx, `INSERT INTO `+sqlident.Quote(b.schema, "events")+` (job_id, type, queue, kind, attempt, data)
		SELECT $1, 'snoozed', 'default', 'k', 0, '{"run_after": "2030-01-01T00:00:00Z"}' FROM generate_series(1, 600)`, r.ID)
	require.NoError(t, err)
	code, body := get(t, nil, b.url+"/jobs/"+strconv.FormatInt(r.ID, 10))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 500, strings.Count(body, `<tr data-event-id=`))
	require.Contains(t, body, `id="older-events"`)
	var newest int64
	require.NoError(t, b.client.Pool().QueryRow(ctx, `SELECT max(id) FROM `+sqlident.Quote(b.schema, "events")).Scan(&newest))
	require.Contains(t, body, `<tr data-event-id="`+strconv.FormatInt(newest, 10)+`"`, "the newest is shown")
	_, err = b.client.JobEventsTail(ctx, r.ID, 0)
	var fe *queue.FilterError
	require.ErrorAs(t, err, &fe)
}

// Behind a reverse proxy that rewrites Host (nginx's default proxy_pass),
// the browser's Origin is the public name and differs from Host: its
// Sec-Fetch-Site: same-origin vouches for it, and the action is done. A
// mismatched Origin without it is still refused.
func TestActionBehindAProxyThatRewritesHost(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	ju := b.url + "/jobs/" + strconv.FormatInt(r.ID, 10)
	_, body := get(t, http.DefaultClient, ju)
	tok := csrfRe.FindStringSubmatch(body)[1]
	post := func(fetchSite string) int {
		req, err := http.NewRequest(http.MethodPost, ju+"/cancel", strings.NewReader(url.Values{"csrf": {tok}, "confirm": {"yes"}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "https://dash.example.com")
		if fetchSite != "" {
			req.Header.Set("Sec-Fetch-Site", fetchSite)
		}
		c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, post(""), "another origin, nothing vouching for it")
	require.Equal(t, http.StatusForbidden, post("cross-site"))
	require.Less(t, post("same-origin"), 400, "the browser says same origin")
	st, err := b.client.JobGet(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, queue.StateCancelled, st.State)
}

// A stream asked for while the feed is not running (Run ended) is a 503
// with Retry-After, which the page retries after 10-15 s: it was a 200 that
// ended at once, and every page reconnected each second for ever.
func TestStreamWithoutTheFeed(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	b.stop() // the feed, the server and the listener
	h2, err := ui.New(ui.Config{Client: b.client})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h2.Run(ctx) }()
	cancel()
	<-done
	srv := httptest.NewServer(h2)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/events")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "10", resp.Header.Get("Retry-After"))
}
