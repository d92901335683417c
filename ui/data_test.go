package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

func probeCSRF(t *testing.T, b *bundle) string {
	_, body := get(t, nil, b.url+"/")
	m := csrfRe.FindStringSubmatch(body)
	if m == nil {
		r, err := b.client.Enqueue(context.Background(), queue.NewJob{Queue: "csrfq", Kind: "k"})
		require.NoError(t, err)
		_, body = get(t, nil, b.url+"/jobs/"+strconv.FormatInt(r.ID, 10))
		m = csrfRe.FindStringSubmatch(body)
	}
	require.NotNil(t, m)
	return m[1]
}

func TestCountersAtRest(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	pool := pgtest.Pool(t)
	jobs := sqlident.Quote(b.schema, "jobs")
	for i := 0; i < 3; i++ {
		_, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "a", Kind: "k"})
		require.NoError(t, err)
	}
	for i := 0; i < 2; i++ {
		_, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "a", Kind: "k", RunAfter: time.Now().Add(time.Hour)})
		require.NoError(t, err)
	}
	f, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "a", Kind: "k"})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET state='failed', finished_at=now(), last_error='x' WHERE id=$1`, f.ID)
	require.NoError(t, err)
	c, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "a", Kind: "k", Priority: 5})
	require.NoError(t, err)
	require.NoError(t, b.client.Cancel(ctx, c.ID))
	require.NoError(t, b.client.PauseQueue(ctx, "empty"))
	code, body := get(t, nil, b.url+"/api/stats")
	require.Equal(t, 200, code)
	var st struct {
		Queues []queue.QueueStat `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	t.Logf("%s", body)
	byQ := map[string]queue.QueueStat{}
	for _, q := range st.Queues {
		byQ[q.Queue] = q
	}
	require.Equal(t, int64(3), byQ["a"].Pending)
	require.Equal(t, int64(2), byQ["a"].Scheduled)
	require.Equal(t, int64(1), byQ["a"].Failed)
	require.True(t, byQ["empty"].Paused)
	_, body = get(t, nil, b.url+"/")
	require.Contains(t, body, `data-queue="empty"`)
}

func TestJobPages(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	pool := pgtest.Pool(t)
	jobs := sqlident.Quote(b.schema, "jobs")
	for _, raw := range []string{`"just a string"`, `42`, `null`, `[1,2]`} {
		r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k", Payload: json.RawMessage(raw)})
		require.NoError(t, err, raw)
		code, body := get(t, nil, b.url+"/jobs/"+strconv.FormatInt(r.ID, 10))
		require.Equal(t, 200, code)
		i := strings.Index(body, `<pre id="payload">`)
		t.Logf("%s -> %q", raw, body[i:i+60])
	}
	r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET payload = jsonb_build_object('big', repeat('x', 10<<20)) WHERE id=$1`, r.ID)
	require.NoError(t, err)
	code, body := get(t, nil, b.url+"/jobs/"+strconv.FormatInt(r.ID, 10))
	require.Equal(t, 200, code)
	require.Less(t, len(body), 200<<10)
	require.Contains(t, body, "Payload cut at")
	// deleted
	_, err = pool.Exec(ctx, `DELETE FROM `+jobs+` WHERE id=$1`, r.ID)
	require.NoError(t, err)
	code, body = get(t, nil, b.url+"/jobs/"+strconv.FormatInt(r.ID, 10))
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "deleted by retention")
	code, _ = get(t, nil, b.url+"/jobs/999999999")
	require.Equal(t, 404, code)
}

func TestActionsRacing(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	tok := probeCSRF(t, b)
	yes := url.Values{"csrf": {tok}, "confirm": {"yes"}}
	r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	u := b.url + "/jobs/" + strconv.FormatInt(r.ID, 10)
	code, body := postForm(t, u+"/retry", yes)
	t.Logf("retry pending: %d %s", code, body)
	require.Equal(t, http.StatusConflict, code)
	// double submit cancel concurrently
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); codes[i], _ = postForm(t, u+"/cancel", yes) }()
	}
	wg.Wait()
	t.Logf("double cancel: %v", codes)
	evs, err := b.client.JobEvents(ctx, r.ID)
	require.NoError(t, err)
	n := 0
	for _, e := range evs {
		if e.Type == queue.EventCancelled {
			n++
		}
	}
	require.Equal(t, 1, n)
	code, body = postForm(t, u+"/cancel", yes)
	t.Logf("cancel cancelled: %d %s", code, body)
	require.Equal(t, http.StatusConflict, code)
	code, body = postForm(t, b.url+"/queues/nosuch/pause", yes)
	t.Logf("pause unknown: %d", code)
	code, body = postForm(t, b.url+"/queues/Bad%20Name/pause", yes)
	t.Logf("pause bad: %d %s", code, body)
	require.Equal(t, 400, code)
	code, _ = postForm(t, b.url+"/jobs/999999/retry", yes)
	require.Equal(t, http.StatusConflict, code)
}

func TestStreamResumeEdges(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	for _, v := range []string{"abc", "-5", "1.5", "99999999999999999999"} {
		req, _ := http.NewRequest("GET", b.url+"/events", nil)
		req.Header.Set("Last-Event-ID", v)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		t.Logf("Last-Event-ID %q -> %d", v, resp.StatusCode)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := stream(t, sctx, b.url+"/events", "123456789")
	r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	deadline := time.After(20 * time.Second)
	for {
		select {
		case e, ok := <-ch:
			require.True(t, ok, "the stream ended")
			if e.event == "job" && strings.Contains(e.data, fmt.Sprintf(`"job_id":%d`, r.ID)) {
				t.Logf("future id: got job event, id %q", e.id)
				return
			}
		case <-deadline:
			t.Fatal("future Last-Event-ID: no live event")
		}
	}
}

func TestPaginationUnderChurn(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	pool := pgtest.Pool(t)
	jobs := sqlident.Quote(b.schema, "jobs")
	batch := make([]queue.NewJob, 1000)
	for i := range batch {
		batch[i] = queue.NewJob{Queue: "p", Kind: "a&b+c#1%"}
	}
	res, err := b.client.EnqueueMany(ctx, batch)
	require.NoError(t, err)
	stable := map[int64]bool{}
	for _, r := range res {
		stable[r.ID] = true
	}
	// churn: some of the 1000 deleted go away (not stable), others added
	var del []int64
	for i, r := range res {
		if i%7 == 0 {
			del = append(del, r.ID)
			delete(stable, r.ID)
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		i := 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = b.client.Enqueue(ctx, queue.NewJob{Queue: "p", Kind: "a&b+c#1%"})
			if i < len(del) {
				_, _ = pool.Exec(ctx, `DELETE FROM `+jobs+` WHERE id=$1`, del[i])
			}
			i++
		}
	}()
	seen := map[int64]int{}
	next := b.url + "/jobs?queue=p&kind=" + url.QueryEscape("a&b+c#1%") + "&limit=37"
	pages := 0
	for next != "" {
		code, body := get(t, nil, next)
		require.Equal(t, 200, code)
		for _, m := range jobIDRe.FindAllStringSubmatch(body, -1) {
			id, _ := strconv.ParseInt(m[1], 10, 64)
			seen[id]++
		}
		n := nextRe.FindStringSubmatch(body)
		next = ""
		if n != nil {
			next = b.srv.URL + strings.ReplaceAll(n[1], "&amp;", "&")
		}
		pages++
		require.Less(t, pages, 200)
	}
	close(stop)
	<-done
	for id := range stable {
		require.Equal(t, 1, seen[id], "job %d", id)
	}
	for id, n := range seen {
		require.Equal(t, 1, n, "job %d twice", id)
	}
}

var jobIDRe = regexpMust(`<tr data-job-id="(\d+)">`)
var nextRe = regexpMust(`<a id="next" href="([^"]+)">`)

func regexpMust(s string) *regexp.Regexp { return regexp.MustCompile(s) }

func TestFarBehindIsToldToReload(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	first, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	_ = first
	for range 21 {
		jobs := make([]queue.NewJob, 1000)
		for i := range jobs {
			jobs[i] = queue.NewJob{Kind: "k"}
		}
		_, err := b.client.EnqueueMany(ctx, jobs)
		require.NoError(t, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := stream(t, sctx, b.url+"/events", "1")
	n := 0
	for e := range ch {
		if e.event == "job" {
			n++
		}
		if e.event == "reload" {
			t.Logf("reload after %d job events", n)
			return
		}
		if e.event == "mark" {
			t.Fatalf("mark after %d events, no reload", n)
		}
	}
	t.Fatalf("stream ended after %d", n)
}

func TestRunningCounters(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	release := make(chan struct{})
	started := make(chan int64, 10)
	h := queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, j *queue.Job) error {
		started <- j.ID
		<-release
		return nil
	})
	worker, err := queue.New(pgtest.Pool(t), queue.Config{Schema: b.schema, Logger: zap.NewNop(),
		Queues:      map[string]queue.QueueConfig{"r": {MaxWorkers: 2}},
		Handlers:    map[string]queue.Handler{"held": h, "leased": h},
		LeasedKinds: []string{"leased"}})
	require.NoError(t, err)
	stop := pgtest.RunInBackground(t, "worker", worker.Run)
	defer stop()
	defer close(release)
	for _, k := range []string{"held", "leased"} {
		_, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "r", Kind: k})
		require.NoError(t, err)
	}
	for range 2 {
		<-started
	}
	for range 3 {
		_, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "r", Kind: "other"})
		require.NoError(t, err)
	}
	code, body := get(t, nil, b.url+"/api/stats")
	require.Equal(t, 200, code)
	var st struct {
		Queues []queue.QueueStat `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	var r *queue.QueueStat
	for i := range st.Queues {
		if st.Queues[i].Queue == "r" {
			r = &st.Queues[i]
		}
	}
	require.NotNil(t, r, body)
	require.Equal(t, int64(2), r.Running, "a held and a leased job run")
	require.Equal(t, int64(3), r.Pending, "the held job's row is pending, but it is not counted as waiting")
	_, body = get(t, nil, b.url+"/")
	require.Contains(t, body, `data-queue="r"`)
	// The list filters on the row's state: a held job that runs is
	// pending there (docs/ui.md, docs/states.md).
	_, body = get(t, nil, b.url+"/jobs?queue=r&state=running")
	require.Len(t, jobIDRe.FindAllString(body, -1), 1, "state=running lists the leased job only")
}
