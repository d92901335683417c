package ui

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/pgwake/pgwake/queue"
)

//go:embed assets
var assets embed.FS

// tokenCookie carries Config.Token after a ?token= visit.
const tokenCookie = "pgwake_ui_token"

// Handler serves the dashboard. Create it with New, run its live feed with
// Run, mount it at Config.Prefix.
type Handler struct {
	cfg    Config
	client *queue.Client
	log    *zap.Logger
	hub    *hub
	mux    *http.ServeMux
	tmpl   *template.Template
	csrf   string // the per-process token every action form carries
	// streams counts the live streams being served (Config.MaxStreams).
	streams atomic.Int64
}

// New builds a Handler from cfg.
func New(cfg Config) (*Handler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	tmpl, err := template.New("").Funcs(template.FuncMap{
		"ts": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
		"tsp": func(t *time.Time) string {
			if t == nil {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05.000Z")
		},
		"cut": cutText,
		// est is a counter as the live page shows it: "~N" when it is the
		// planner's estimate (app.js fmtNum; TestOverviewMarksEstimatesAsServed).
		"est": func(q queue.QueueStat, field string, n int64) string {
			s := strconv.FormatInt(n, 10)
			if slices.Contains(q.Estimated, field) {
				return "~" + s
			}
			return s
		},
	}).ParseFS(assets, "assets/*.html")
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, client: cfg.Client, log: cfg.Logger.Named("ui"), hub: newHub(cfg), tmpl: tmpl,
		csrf: hex.EncodeToString(b[:])}
	p := cfg.Prefix
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+p+"/{$}", h.overview)
	mux.HandleFunc("GET "+p+"/jobs", h.jobs)
	mux.HandleFunc("GET "+p+"/jobs/{id}", h.job)
	mux.HandleFunc("POST "+p+"/jobs/{id}/{action}", h.jobAction)
	mux.HandleFunc("POST "+p+"/queues/{queue}/{action}", h.queueAction)
	mux.HandleFunc("GET "+p+"/events", h.events)
	mux.HandleFunc("GET "+p+"/api/stats", h.apiStats)
	static, _ := fs.Sub(assets, "assets")
	files := http.StripPrefix(p+"/static/", http.FileServerFS(static))
	mux.Handle("GET "+p+"/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // files only: no directory listing
			return
		}
		files.ServeHTTP(w, r)
	}))
	h.mux = mux
	return h, nil
}

// Run keeps the live feed: it registers a watcher, listens on the events
// channel (Config.Listener) and pushes events and counters to the open
// pages, until ctx is done. Without Run pages work but are not live.
func (h *Handler) Run(ctx context.Context) error { return h.hub.run(ctx) }

// ServeHTTP checks the token and the request, then serves the page.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("Cache-Control", "no-store")
	if h.cfg.Token != "" && !h.authorized(w, r) {
		return
	}
	if h.cfg.Token == "" && !localHost(r.Host) {
		// Without a token only an address typed as such is served: a web
		// page whose name was rebound to 127.0.0.1 (DNS rebinding) cannot
		// read the dashboard or its form token.
		http.Error(w, "without --token the dashboard answers only to localhost or an IP address; set a token to serve under a host name", http.StatusForbidden)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// localHost reports whether a Host header names localhost or an IP literal.
func localHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	return host == "localhost" || net.ParseIP(host) != nil
}

// authorized checks Config.Token: a bearer header, the cookie, or ?token=
// (which sets the cookie and redirects to the same URL without it).
func (h *Handler) authorized(w http.ResponseWriter, r *http.Request) bool {
	eq := func(s string) bool { return subtle.ConstantTimeCompare([]byte(s), []byte(h.cfg.Token)) == 1 }
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") && eq(strings.TrimPrefix(a, "Bearer ")) {
		return true
	}
	if c, err := r.Cookie(tokenCookie); err == nil && eq(c.Value) {
		return true
	}
	if t := r.URL.Query().Get("token"); t != "" && eq(t) && r.Method == http.MethodGet {
		path := h.cfg.Prefix + "/"
		if h.cfg.Prefix != "" {
			path = h.cfg.Prefix
		}
		// Secure also behind a proxy that ends TLS and says so.
		secure := r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
		http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: h.cfg.Token, Path: path, HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: secure})
		q := r.URL.Query()
		q.Del("token")
		u := *r.URL
		u.RawQuery = q.Encode()
		if strings.HasPrefix(u.Path, "//") || strings.HasPrefix(u.Path, "/\\") {
			// "//host/x" would send the browser to another site (a
			// redirect a link with a valid token could abuse): the
			// overview instead.
			u.Path, u.RawPath = h.cfg.Prefix+"/", ""
		}
		http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="pgwake"`)
	http.Error(w, "a token is required: open the URL with ?token=... or send Authorization: Bearer", http.StatusUnauthorized)
	return false
}

// page is what every template gets.
type page struct {
	Title    string
	Prefix   string
	CSRF     string
	ReadOnly bool
	Schema   string
	// After is the feed's resume point when the page was read: its event
	// stream starts there, so nothing committed meanwhile is missed. -1:
	// the feed is not running yet.
	After int64
	Data  any
}

func (h *Handler) render(w http.ResponseWriter, status int, name, title string, data any) {
	h.renderAfter(w, status, name, title, data, -1)
}

// renderAfter renders a page whose data was read after the feed's resume
// point after.
func (h *Handler) renderAfter(w http.ResponseWriter, status int, name, title string, data any, after int64) {
	var buf bytes.Buffer
	err := h.tmpl.ExecuteTemplate(&buf, name, page{Title: title, Prefix: h.cfg.Prefix, CSRF: h.csrf,
		ReadOnly: h.cfg.ReadOnly, Schema: h.client.Schema(), After: after, Data: data})
	if err != nil {
		h.log.Warn("rendering a page failed", zap.String("page", name), zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (h *Handler) fail(w http.ResponseWriter, status int, msg string) {
	h.render(w, status, "error.html", http.StatusText(status), msg)
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	after := h.hub.resumePoint()
	st, err := h.client.QueueStats(r.Context(), queue.QueueStatsParams{ExactLimit: h.cfg.ExactLimit})
	if err != nil {
		h.log.Warn("reading queue stats failed", zap.Error(err))
		h.fail(w, http.StatusServiceUnavailable, "cannot read the queues: "+err.Error())
		return
	}
	h.renderAfter(w, http.StatusOK, "overview.html", "Overview", st, after)
}

func (h *Handler) apiStats(w http.ResponseWriter, r *http.Request) {
	st, err := h.client.QueueStats(r.Context(), queue.QueueStatsParams{ExactLimit: h.cfg.ExactLimit})
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"queues": st})
}

// jobsData is the jobs page's data.
type jobsData struct {
	Params   queue.JobListParams
	Page     queue.JobListPage
	States   []queue.JobState
	NextURL  string
	FirstURL string
	Error    string
}

func (h *Handler) jobs(w http.ResponseWriter, r *http.Request) {
	after := h.hub.resumePoint()
	q := r.URL.Query()
	p := queue.JobListParams{State: queue.JobState(q.Get("state")), Queue: q.Get("queue"), Kind: q.Get("kind"), ErrorContains: q.Get("error")}
	d := jobsData{States: queue.States()}
	var bad error
	if v := q.Get("before"); v != "" {
		if p.Before, bad = strconv.ParseInt(v, 10, 64); bad != nil {
			bad = &queue.FilterError{Field: "before", Reason: "not a job id"}
		}
	}
	if v := q.Get("limit"); v != "" && bad == nil {
		if p.Limit, bad = strconv.Atoi(v); bad != nil {
			bad = &queue.FilterError{Field: "limit", Reason: "not a number"}
		}
	}
	d.Params = p
	if bad == nil {
		d.Page, bad = h.client.JobList(r.Context(), p)
	}
	var fe *queue.FilterError
	switch {
	case errors.As(bad, &fe):
		d.Error = fe.Error()
		h.render(w, http.StatusBadRequest, "jobs.html", "Jobs", d)
		return
	case bad != nil:
		h.fail(w, http.StatusServiceUnavailable, "cannot list jobs: "+bad.Error())
		return
	}
	first := url.Values{}
	for _, k := range []string{"state", "queue", "kind", "error", "limit"} {
		if v := q.Get(k); v != "" {
			first.Set(k, v)
		}
	}
	d.FirstURL = h.cfg.Prefix + "/jobs?" + first.Encode()
	if d.Page.Next != 0 {
		first.Set("before", strconv.FormatInt(d.Page.Next, 10))
		d.NextURL = h.cfg.Prefix + "/jobs?" + first.Encode()
	}
	h.renderAfter(w, http.StatusOK, "jobs.html", "Jobs", d, after)
}

// jobData is the job page's data.
type jobData struct {
	ID         int64
	Job        queue.JobInfo
	Deleted    bool
	Payload    string
	Truncated  bool
	Events     []eventView
	Errors     []eventView
	CanRetry   bool
	CanCancel  bool
	LastEvent  int64
	PayloadCap int
	Older      bool // older events than those shown may exist (jobPageEvents)
}

// jobPageEvents is how many of a job's newest events its page shows: a job
// that snoozed or retried thousands of times made a page of every event
// (85 MB for 20,000 events with their errors).
const jobPageEvents = 500

type eventView struct {
	queue.EventInfo
	DataText string
	Error    string
}

func (h *Handler) job(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		h.fail(w, http.StatusBadRequest, "not a job id")
		return
	}
	ctx := r.Context()
	after := h.hub.resumePoint()
	j, err := h.client.JobGet(ctx, id)
	deleted := errors.Is(err, queue.ErrNotFound)
	if err != nil && !deleted {
		h.fail(w, http.StatusServiceUnavailable, "cannot read the job: "+err.Error())
		return
	}
	evs, err := h.client.JobEventsTail(ctx, id, jobPageEvents)
	if err != nil {
		h.fail(w, http.StatusServiceUnavailable, "cannot read the job's events: "+err.Error())
		return
	}
	if deleted && len(evs) == 0 {
		h.fail(w, http.StatusNotFound, "no such job")
		return
	}
	d := jobData{ID: id, Job: j, Deleted: deleted, PayloadCap: h.cfg.PayloadLimit}
	if deleted {
		d.Job = queue.JobInfo{ID: id, Queue: evs[0].Queue, Kind: evs[0].Kind}
	}
	d.Payload, d.Truncated = pretty(j.Payload, h.cfg.PayloadLimit)
	for _, e := range evs {
		v := eventView{EventInfo: e}
		if len(e.Data) > 0 && string(e.Data) != "{}" {
			v.DataText, _ = pretty(e.Data, 2048)
			var m struct {
				Error string `json:"error"`
			}
			if json.Unmarshal(e.Data, &m) == nil && m.Error != "" {
				v.Error = m.Error
				if len(v.Error) > 16<<10 {
					v.Error = cutText(v.Error, 16<<10) + "\n(truncated)"
				}
				d.Errors = append(d.Errors, v)
			}
		}
		d.Events = append(d.Events, v)
		d.LastEvent = e.ID
	}
	d.Older = len(evs) == jobPageEvents
	d.CanRetry = !deleted && j.State == queue.StateFailed
	d.CanCancel = !deleted && (j.State == queue.StatePending || j.State == queue.StateRunning)
	h.renderAfter(w, http.StatusOK, "job.html", "Job "+strconv.FormatInt(id, 10), d, after)
}

// pretty indents JSON and caps it at limit bytes.
func pretty(raw []byte, limit int) (string, bool) {
	if len(raw) == 0 {
		return "", false
	}
	var buf bytes.Buffer
	if len(raw) > 4*limit || json.Indent(&buf, raw, "", "  ") != nil {
		buf.Reset()
		buf.Write(raw)
	}
	if buf.Len() > limit {
		return cutAt(buf.String(), limit), true
	}
	return buf.String(), false
}

// confirmData is the confirmation page's data.
type confirmData struct {
	What   string
	Action string // the form's URL
	Back   string
}

// checkAction refuses an action in read-only mode, without the form's
// CSRF token, or from another origin.
func (h *Handler) checkAction(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.ReadOnly {
		h.fail(w, http.StatusForbidden, "this dashboard is read-only")
		return false
	}
	// A browser's Sec-Fetch-Site: same-origin vouches for the origin where
	// a reverse proxy rewrote Host (nginx's default proxy_pass), and the
	// Origin, the public name, then differs from it
	// (TestActionBehindAProxyThatRewritesHost).
	sameOrigin := r.Header.Get("Sec-Fetch-Site") == "same-origin"
	if o := r.Header.Get("Origin"); o != "" && o != "null" && !sameOrigin {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			h.fail(w, http.StatusForbidden, "cross-origin request refused")
			return false
		}
	}
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		h.fail(w, http.StatusForbidden, "cross-site request refused")
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if err := r.ParseForm(); err != nil || subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(h.csrf)) != 1 {
		h.fail(w, http.StatusForbidden, "missing or wrong form token: reload the page and try again")
		return false
	}
	return true
}

// confirmed reports whether the action's form carried the confirmation;
// if not, it renders the confirmation page for it.
func (h *Handler) confirmed(w http.ResponseWriter, r *http.Request, c confirmData) bool {
	if r.PostForm.Get("confirm") == "yes" {
		return true
	}
	h.render(w, http.StatusOK, "confirm.html", "Confirm", c)
	return false
}

func (h *Handler) jobAction(w http.ResponseWriter, r *http.Request) {
	if !h.checkAction(w, r) {
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		h.fail(w, http.StatusBadRequest, "not a job id")
		return
	}
	action := r.PathValue("action")
	back := h.cfg.Prefix + "/jobs/" + strconv.FormatInt(id, 10)
	var do func(context.Context, int64) error
	switch action {
	case "retry":
		do = h.client.Retry
	case "cancel":
		do = h.client.Cancel
	default:
		h.fail(w, http.StatusNotFound, "no such action")
		return
	}
	if !h.confirmed(w, r, confirmData{What: action + " job " + strconv.FormatInt(id, 10), Action: back + "/" + action, Back: back}) {
		return
	}
	if err := do(r.Context(), id); err != nil {
		if errors.Is(err, queue.ErrNotFound) {
			h.fail(w, http.StatusConflict, "cannot "+action+" job "+strconv.FormatInt(id, 10)+": no such job, or not in a state that allows it")
			return
		}
		var held *queue.UniqueKeyHeldError
		if errors.As(err, &held) {
			// The job's state refuses it, as above: not an outage
			// (TestRetryWithItsKeyHeldIsAConflict).
			h.fail(w, http.StatusConflict, "cannot "+action+" job "+strconv.FormatInt(id, 10)+": its unique key is held by job "+
				strconv.FormatInt(held.HolderID, 10)+"; cancel or finish that job first")
			return
		}
		h.fail(w, http.StatusServiceUnavailable, action+" failed: "+err.Error())
		return
	}
	h.log.Info("job action", zap.String("action", action), zap.Int64("job_id", id))
	http.Redirect(w, r, back, http.StatusSeeOther)
}

func (h *Handler) queueAction(w http.ResponseWriter, r *http.Request) {
	if !h.checkAction(w, r) {
		return
	}
	q, action := r.PathValue("queue"), r.PathValue("action")
	var do func(context.Context, string) error
	switch action {
	case "pause":
		do = h.client.PauseQueue
	case "resume":
		do = h.client.ResumeQueue
	default:
		h.fail(w, http.StatusNotFound, "no such action")
		return
	}
	back := h.cfg.Prefix + "/"
	if !h.confirmed(w, r, confirmData{What: action + " queue " + q, Action: h.cfg.Prefix + "/queues/" + url.PathEscape(q) + "/" + action, Back: back}) {
		return
	}
	if err := do(r.Context(), q); err != nil {
		h.fail(w, http.StatusBadRequest, action+" failed: "+err.Error())
		return
	}
	h.log.Info("queue action", zap.String("action", action), zap.String("queue", q))
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// FeedReads is what the live feed has read from the database since Run
// started: its whole load, whatever the number of open pages.
type FeedReads struct {
	QueueStats int // QueueStats statements
	EventLog   int // event log reads (EventsAfter, plus EventsByID for skipped ids)
}

// Started is closed once Run's feed has started: events committed from
// then on reach the open pages.
func (h *Handler) Started() <-chan struct{} { return h.hub.start }

// Reads returns the live feed's reads so far.
func (h *Handler) Reads() FeedReads {
	s, e := h.hub.counts()
	return FeedReads{QueueStats: s, EventLog: e}
}

// cutText is s cut to at most n bytes at a character boundary, with "…"
// when cut: a page served as UTF-8 never holds half a character
// (TestCutTextKeepsCharacters).
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return cutAt(s, n) + "…"
}

// cutAt is s cut to at most n bytes (n < len(s)), not inside a character.
func cutAt(s string, n int) string {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
