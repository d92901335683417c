package ui_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// Two dashboards in one mux, at /a and /b, on two schemas of one database
// with the same queue name, sharing one Listener, each with its own token:
// each page, stream and action reaches its own schema only; a token cookie
// of one does not open the other; one's form token does not act on the
// other.
func TestTwoDashboardsInOneMux(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	cc, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	l, err := notify.New(notify.Config{ConnConfig: cc})
	require.NoError(t, err)
	pgtest.RunInBackground(t, "listener", l.Run)
	mux := http.NewServeMux()
	type dash struct {
		client *queue.Client
		h      *ui.Handler
		token  string
	}
	ds := map[string]*dash{}
	for _, name := range []string{"a", "b"} {
		schema := pgtest.SchemaOn(t, pool)
		_, err := migrations.Up(ctx, pool, schema)
		require.NoError(t, err)
		c, err := queue.New(pool, queue.Config{Schema: schema})
		require.NoError(t, err)
		d := &dash{client: c, token: "token-of-" + name + "-0123456789abcdef"}
		d.h, err = ui.New(ui.Config{Client: c, Listener: l, Prefix: "/" + name, Token: d.token})
		require.NoError(t, err)
		mux.Handle("/"+name+"/", d.h)
		pgtest.RunInBackground(t, "feed "+name, d.h.Run)
		select {
		case <-d.h.Started():
		case <-time.After(30 * time.Second):
			t.Fatal("feed did not start")
		}
		ds[name] = d
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	// Same job ids in both schemas: id 1 and 2 in a, id 1 in b.
	ra, err := ds["a"].client.EnqueueMany(ctx, []queue.NewJob{{Kind: "ka"}, {Kind: "ka"}})
	require.NoError(t, err)
	rb, err := ds["b"].client.Enqueue(ctx, queue.NewJob{Kind: "kb"})
	require.NoError(t, err)

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	hc := &http.Client{Jar: jar}
	code, _ := get(t, hc, srv.URL+"/a/?token="+ds["a"].token)
	require.Equal(t, http.StatusOK, code)
	code, _ = get(t, hc, srv.URL+"/b/")
	require.Equal(t, http.StatusUnauthorized, code, "a's cookie opened b")
	code, _ = get(t, hc, srv.URL+"/b/?token="+ds["b"].token)
	require.Equal(t, http.StatusOK, code)

	code, body := get(t, hc, srv.URL+"/a/jobs")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "ka")
	require.NotContains(t, body, ">kb<")
	code, body = get(t, hc, srv.URL+"/b/jobs/"+strconv.FormatInt(rb.ID, 10))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "kb")
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(t, m)

	// b's form token does not cancel a's job of the same id.
	post := func(u string, form url.Values) int {
		c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := c.PostForm(u, form)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, post(srv.URL+"/a/jobs/"+strconv.FormatInt(ra[0].ID, 10)+"/cancel", url.Values{"csrf": {m[1]}, "confirm": {"yes"}}))
	j, err := ds["a"].client.JobGet(ctx, ra[0].ID)
	require.NoError(t, err)
	require.Equal(t, queue.StatePending, j.State)
	// Pausing "default" through /b pauses b's only.
	require.Equal(t, http.StatusSeeOther, post(srv.URL+"/b/queues/default/pause", url.Values{"csrf": {m[1]}, "confirm": {"yes"}}))
	qa, err := ds["a"].client.Queues(ctx)
	require.NoError(t, err)
	for _, q := range qa {
		require.False(t, q.Paused, "a's queue %s paused through b", q.Queue)
	}
	qb, err := ds["b"].client.Queues(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, qb)
	require.True(t, qb[0].Paused)

	// b's stream carries b's events only.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, srv.URL+"/b/events", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+ds["b"].token)
	req.Header.Set("Last-Event-ID", "0")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = ds["a"].client.Enqueue(ctx, queue.NewJob{Kind: "ka_later"})
	require.NoError(t, err)
	_, err = ds["b"].client.Enqueue(ctx, queue.NewJob{Kind: "kb_later"})
	require.NoError(t, err)
	lines := make(chan string, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "stream ended")
			if !strings.HasPrefix(line, "data: ") || !strings.Contains(line, `"kind"`) {
				continue
			}
			var je struct {
				Kind string `json:"kind"`
			}
			if json.Unmarshal([]byte(line[6:]), &je) != nil {
				continue
			}
			require.NotContains(t, je.Kind, "ka", "a's event on b's stream")
			if je.Kind == "kb_later" {
				return
			}
		case <-deadline:
			t.Fatal("b's event did not arrive")
		}
	}
}
