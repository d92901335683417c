package ui_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// produce enqueues one job per transaction at rate per second for d.
func produce(t testing.TB, c *queue.Client, rate float64, d time.Duration) int {
	t.Helper()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	end := time.After(d)
	n := 0
	for {
		select {
		case <-end:
			return n
		case <-tick.C:
			_, err := c.Enqueue(context.Background(), queue.NewJob{Queue: "load", Kind: "k", Payload: map[string]int64{"at": time.Now().UnixNano()}})
			require.NoError(t, err)
			n++
		}
	}
}

// The live feed's reads do not grow with the open pages: with 10 streams
// open and jobs flowing at 200/s through a worker, it reads the counters at
// most once per StatsMinInterval (plus the refreshes) and the event log at
// most once per 50 ms (notifications in a burst share a read).
func TestFeedLoadIsPerProcess(t *testing.T) {
	b := setup(t, ui.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 10 {
		stream(t, ctx, b.url+"/events", "")
	}
	worker, err := queue.New(pgtest.Pool(t), queue.Config{Schema: b.schema, Logger: zap.NewNop(),
		Queues:   map[string]queue.QueueConfig{"load": {MaxWorkers: 4}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })}})
	require.NoError(t, err)
	pgtest.RunInBackground(t, "worker", worker.Run)
	before := b.h.Reads()
	start := time.Now()
	n := produce(t, b.client, 200, 5*time.Second)
	secs := time.Since(start).Seconds()
	after := b.h.Reads()
	statsPerSec := float64(after.QueueStats-before.QueueStats) / secs
	logPerSec := float64(after.EventLog-before.EventLog) / secs
	t.Logf("10 streams, %d jobs in %.1f s: %.1f QueueStats/s, %.1f event log reads/s", n, secs, statsPerSec, logPerSec)
	require.LessOrEqual(t, statsPerSec, 1/0.1+1, "at most one counter read per StatsMinInterval")
	require.Greater(t, after.EventLog, before.EventLog)
	require.LessOrEqual(t, logPerSec, 1/0.05+4+1, "at most one event log read per 50 ms, plus the gap checks")
}

// A dashboard with no page open reads no counters while jobs flow (it
// still tails the event log, for the sparklines); the first stream to open
// then gets fresh counters, not the ones of before it was idle.
func TestIdleFeedReadsNoCounters(t *testing.T) {
	b := setup(t, ui.Config{})
	before := b.h.Reads()
	start := time.Now()
	n := produce(t, b.client, 200, 2*time.Second)
	pgtest.WaitFor(t, 10*time.Second, "the feed tails the jobs' events", func() bool {
		return b.h.Reads().EventLog > before.EventLog
	})
	after := b.h.Reads()
	secs := time.Since(start).Seconds()
	t.Logf("no stream open, %d jobs in %.1f s: %.1f QueueStats/s, %.1f event log reads/s", n, secs,
		float64(after.QueueStats-before.QueueStats)/secs, float64(after.EventLog-before.EventLog)/secs)
	require.Equal(t, before.QueueStats, after.QueueStats, "no counters read while no stream is open")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := stream(t, ctx, b.url+"/events", "")
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-events:
			require.True(t, ok, "the stream ended")
			if e.event != "stats" {
				continue
			}
			var m struct {
				Queues []queue.QueueStat `json:"queues"`
			}
			require.NoError(t, json.Unmarshal([]byte(e.data), &m))
			require.Len(t, m.Queues, 1)
			require.Equal(t, int64(n), m.Queues[0].Pending, "the first counters a stream gets are fresh")
			require.Greater(t, b.h.Reads().QueueStats, after.QueueStats, "a read for the new stream")
			return
		case <-timeout:
			t.Fatal("no counters on the stream")
		}
	}
}

// The blocks of BenchmarkDashboardLatencyImpact.
const (
	blockJobs     = 1000                   // jobs in each block: 5 s at blockRate
	blockRate     = 200                    // jobs per second, one per transaction
	blockSettle   = 500 * time.Millisecond // from a block's setup to its first job
	bootstrapN    = 2000                   // bootstrap resamples
	bootstrapSeed = 16
	targetRatio   = 1.10 // issue 16: the p99 no more than 10% worse
	minRounds     = 10   // fewer rounds: the log gives no verdict
)

// benchMode is one configuration of BenchmarkDashboardLatencyImpact.
type benchMode struct {
	name   string // the metrics' name
	what   string
	uiCost bool // a dashboard runs: its statements are counted
}

var benchModes = []benchMode{
	{"without", "no dashboard", false},
	{"aa", "no dashboard again (A/A: the noise floor)", false},
	{"watcher", "a watcher registered, nothing read (the NOTIFYs alone)", false},
	{"with", "a dashboard in the worker's process, 10 streams from another process", true},
	{"process", "a dashboard and its 10 streams in a process of their own (pgwake ui)", true},
}

// extraModes are configurations that run only when named in
// envBenchExtra (comma-separated), to tell apart where the dashboard's cost
// goes; without it the benchmark runs benchModes alone, as before.
var extraModes = []benchMode{
	// PostgreSQL before 19 signals every listening backend of the
	// database at each NOTIFY, whatever its channel (async.c): a
	// dashboard's LISTEN connection is woken by each enqueue's wake-up
	// NOTIFY too.
	{"listen", "a LISTEN connection on the events channel, no watcher registered, nothing read", false},
	{"shared", "a dashboard in the worker's process sharing the worker's Listener (one LISTEN per process), 10 streams from another process", true},
}

// envBenchExtra names the extraModes BenchmarkDashboardLatencyImpact runs
// too, e.g. PGWAKE_UI_BENCH_EXTRA=listen,shared.
const envBenchExtra = "PGWAKE_UI_BENCH_EXTRA"

// envBenchNice, a niceness (0-19), runs BenchmarkDashboardLatencyImpact's
// other process (the 10 browser tabs, and in `process` the dashboard too)
// under nice(1): on a machine of few cores the tabs and the dashboard then
// take CPU only when the queue does not want it, as on hosts of their own;
// the dashboard's work in PostgreSQL keeps its priority.
const envBenchNice = "PGWAKE_UI_BENCH_NICE"

// activeModes is benchModes and the extraModes named in envBenchExtra.
func activeModes(tb testing.TB) []benchMode {
	modes := slices.Clone(benchModes)
	for name := range strings.SplitSeq(os.Getenv(envBenchExtra), ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		i := slices.IndexFunc(extraModes, func(m benchMode) bool { return m.name == name })
		if i < 0 {
			tb.Fatalf("%s: no configuration %q", envBenchExtra, name)
		}
		modes = append(modes, extraModes[i])
	}
	return modes
}

// BenchmarkDashboardLatencyImpact measures the queue's latency (from the
// enqueue call to handler start) with and without a dashboard, and the
// statements the dashboard sends. It runs blocks of blockJobs jobs at
// blockRate per second through a worker, each on a fresh schema, in rounds
// of one block per configuration (benchModes, in an order that rotates each
// round), after one discarded warm-up block. -benchtime Nx runs N rounds:
// about 29 s each on the 2-core development machine.
//
// Per configuration it reports the p99 of all its blocks' jobs pooled
// (p99_ms_NAME) and, for each against "without", the ratio of the pooled
// p99s (NAME_ratio) with a 90% bootstrap interval (NAME_ci90_low,
// NAME_ci90_high: bootstrapN resamples of whole rounds, fixed seed). "aa"
// is "without" run again: its interval shows the noise floor. For the two
// dashboard configurations it reports the statements the dashboard sent
// per second of block (NAME_stmts/s, counted by a pgx tracer on its pool)
// and their summed duration as its pool saw them (NAME_stmt_ms/s), and for
// the in-process one the NOTIFYs per second on the events channel and the
// delays from an 'enqueued' event's insert to its arrival on the first
// stream (stream_p99_ms, stream_max_ms).
//
//	go test -run '^$' -bench BenchmarkDashboardLatencyImpact -benchtime 20x -v -timeout 60m ./ui/
func BenchmarkDashboardLatencyImpact(b *testing.B) {
	counter := newStmtCounter(false)
	pool := pgtest.NewPool(b, func(c *pgxpool.Config) {
		c.MaxConns = 20
		c.ConnConfig.Tracer = counter
	})
	blocks := map[string][][]float64{}
	var sum blockSums
	modes := activeModes(b)
	runBlock(b, pool, counter, benchModes[3], &blockSums{}) // warm-up, not counted
	rounds := 0
	for b.Loop() {
		for i := range modes {
			m := modes[(i+rounds)%len(modes)]
			lat := runBlock(b, pool, counter, m, &sum)
			blocks[m.name] = append(blocks[m.name], lat)
		}
		rounds++
	}
	b.StopTimer()
	reportLatency(b, modes, blocks, rounds)
	sum.report(b, modes)
}

// reportLatency reports the pooled p99s and the ratios with their
// intervals, and logs them with what they show.
func reportLatency(b *testing.B, modes []benchMode, blocks map[string][][]float64, rounds int) {
	base := newTails(blocks["without"], blockJobs)
	all := make([]int, rounds)
	for i := range all {
		all[i] = i
	}
	b.Logf("%d rounds of %d blocks, %d jobs each at %d/s; 90%% intervals from %d bootstrap resamples of the rounds",
		rounds, len(modes), blockJobs, blockRate, bootstrapN)
	for _, m := range modes {
		t := newTails(blocks[m.name], blockJobs)
		p := t.p99(all)
		b.ReportMetric(p, "p99_ms_"+m.name)
		if m.name == "without" {
			b.Logf("%-8s p99 %.2f ms: %s", m.name, p, m.what)
			continue
		}
		r, lo, hi := ratioCI(base, t, bootstrapN, bootstrapSeed)
		b.ReportMetric(r, m.name+"_ratio")
		b.ReportMetric(lo, m.name+"_ci90_low")
		b.ReportMetric(hi, m.name+"_ci90_high")
		v := verdict(lo, hi, targetRatio)
		if rounds < minRounds {
			v = fmt.Sprintf("no verdict from %d rounds (at least %d)", rounds, minRounds)
		}
		b.Logf("%-8s p99 %.2f ms, ratio %.3f, 90%% interval [%.3f, %.3f], against %.2f: %s; %s",
			m.name, p, r, lo, hi, targetRatio, v, m.what)
	}
	if rounds < minRounds {
		b.Logf("only %d rounds: a bootstrap of so few understates the spread; use -benchtime 20x (a multiple of %d rounds)", rounds, len(modes))
	}
}

// blockSums adds up the dashboard configurations' statements and the
// in-process dashboard's NOTIFYs and stream delays over their blocks.
type blockSums struct {
	secs     map[string]float64
	stmts    map[string]stmtSnap
	notifies float64
	toStream []float64
	// Every configuration: its seconds, and what the benchmark's process
	// (the worker's and the producer's, and in "with" and "shared" the
	// dashboard's) spent in them.
	procSecs map[string]float64
	proc     map[string]procStats
	readers  map[string]time.Duration // CPU of the streams' process ("with", "shared")
}

// addProc adds a block's seconds and its process's spending.
func (s *blockSums) addProc(mode string, secs float64, p procStats, readers time.Duration) {
	if s.procSecs == nil {
		s.procSecs, s.proc, s.readers = map[string]float64{}, map[string]procStats{}, map[string]time.Duration{}
	}
	s.procSecs[mode] += secs
	s.proc[mode] = s.proc[mode].plus(p)
	s.readers[mode] += readers
}

func (s *blockSums) add(mode string, secs float64, st stmtSnap) {
	if s.secs == nil {
		s.secs, s.stmts = map[string]float64{}, map[string]stmtSnap{}
	}
	s.secs[mode] += secs
	s.stmts[mode] = s.stmts[mode].plus(st)
}

func (s *blockSums) report(b *testing.B, modes []benchMode) {
	for _, m := range modes {
		secs := s.procSecs[m.name]
		if secs == 0 {
			continue
		}
		p := s.proc[m.name]
		b.ReportMetric(float64(p.CPU.Microseconds())/1000/secs, "cpu_ms/s_"+m.name)
		b.ReportMetric(float64(p.GCs)/secs, "gc/s_"+m.name)
		line := fmt.Sprintf("%-8s the worker's process used %.1f ms/s of CPU, %.2f GC cycles/s", m.name,
			float64(p.CPU.Microseconds())/1000/secs, float64(p.GCs)/secs)
		if r := s.readers[m.name]; r > 0 {
			b.ReportMetric(float64(r.Microseconds())/1000/secs, m.name+"_readers_cpu_ms/s")
			line += fmt.Sprintf("; the 10 streams' readers %.1f ms/s", float64(r.Microseconds())/1000/secs)
		}
		if m.name == "process" {
			d := s.stmts[m.name].CPU
			b.ReportMetric(float64(d.Microseconds())/1000/s.secs[m.name], "process_dashboard_cpu_ms/s")
			line += fmt.Sprintf("; the dashboard's process (its 10 readers included) %.1f ms/s", float64(d.Microseconds())/1000/s.secs[m.name])
		}
		b.Log(line)
	}
	for _, m := range modes {
		secs := s.secs[m.name]
		if !m.uiCost || secs == 0 {
			continue
		}
		st := s.stmts[m.name]
		b.ReportMetric(float64(st.N)/secs, m.name+"_stmts/s")
		b.ReportMetric(float64(st.Dur.Microseconds())/1000/secs, m.name+"_stmt_ms/s")
		b.Logf("%-8s the dashboard sent %.1f statements/s (%.1f ms/s of statement time as its pool saw it) over %.0f s:",
			m.name, float64(st.N)/secs, float64(st.Dur.Microseconds())/1000/secs, secs)
		for _, q := range st.top(6) {
			b.Logf("         %6.1f/s %6.1f ms/s  %s", float64(st.BySQL[q])/secs, float64(st.DurSQL[q].Microseconds())/1000/secs, q)
		}
	}
	if secs := s.secs["with"]; secs > 0 {
		b.ReportMetric(s.notifies/secs, "notifies/s")
	}
	if len(s.toStream) > 0 {
		b.ReportMetric(p99(s.toStream), "stream_p99_ms")
		b.ReportMetric(slices.Max(s.toStream), "stream_max_ms")
	}
}

// runBlock runs one block of mode on a fresh schema and returns its jobs'
// latencies (ms), exactly blockJobs of them; it adds the dashboard's
// statements and the rest to sum.
func runBlock(b *testing.B, pool *pgxpool.Pool, counter *stmtCounter, mode benchMode, sum *blockSums) []float64 {
	ctx := context.Background()
	schema := pgtest.SchemaOn(b, pool)
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(b, err)
	defer func() {
		_, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		require.NoError(b, err)
	}()
	client, err := queue.New(pool, queue.Config{Schema: schema})
	require.NoError(b, err)
	snap := counter.snapshot
	var notes *atomic.Int64
	var streams *helper
	var shared *notify.Listener // the worker's and the dashboard's, in "shared"
	switch mode.name {
	case "watcher":
		require.NoError(b, client.WatchEvents(ctx, "bench"))
	case "with":
		d := setupMarked(b, ui.Config{Client: client}, markUI)
		defer d.stop()
		n, stop := countNotificationsUntil(b, schema)
		defer stop()
		notes = n
		streams = startHelper(b, envStreamsURL+"="+d.url)
		defer streams.stop(b, nil)
	case "listen":
		l, stopL := startListener(b)
		defer stopL()
		unsub, err := l.Subscribe(queue.EventsChannel(schema), func(notify.Event) {})
		require.NoError(b, err)
		defer unsub()
	case "shared":
		var stopL func()
		shared, stopL = startListener(b)
		defer stopL()
		d := setupMarked(b, ui.Config{Client: client, Listener: shared}, markUI)
		defer d.stop()
		streams = startHelper(b, envStreamsURL+"="+d.url)
		defer streams.stop(b, nil)
	case "process":
		h := startHelper(b, envDashboardSchema+"="+schema)
		defer h.stop(b, nil)
		snap = func() stmtSnap { return h.snap(b) }
	}
	var mu sync.Mutex
	lat := make([]float64, 0, blockJobs)
	worker, err := queue.New(pool, queue.Config{Schema: schema, Logger: zap.NewNop(), Listener: shared,
		Queues: map[string]queue.QueueConfig{"load": {MaxWorkers: 4}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			var p struct {
				At int64 `json:"at"`
			}
			if err := json.Unmarshal(j.Payload, &p); err != nil {
				return err
			}
			mu.Lock()
			lat = append(lat, float64(time.Now().UnixNano()-p.At)/1e6)
			mu.Unlock()
			return nil
		})}})
	require.NoError(b, err)
	stop := pgtest.RunInBackground(b, "worker", worker.Run)
	defer stop()
	time.Sleep(blockSettle)

	var readers0 stmtSnap
	if streams != nil {
		readers0 = streams.snap(b)
	}
	p0 := readProcStats()
	before, start := snap(), time.Now()
	var notesBefore int64
	if notes != nil {
		notesBefore = notes.Load()
	}
	produceN(b, client, blockRate, blockJobs)
	pgtest.WaitFor(b, time.Minute, "the block's jobs handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lat) >= blockJobs
	})
	secs := time.Since(start).Seconds()
	if mode.uiCost {
		sum.add(mode.name, secs, snap().minus(before))
	}
	var readers time.Duration
	if streams != nil {
		readers = streams.snap(b).minus(readers0).CPU
	}
	sum.addProc(mode.name, secs, readProcStats().minus(p0), readers)
	if notes != nil {
		sum.notifies += float64(notes.Load() - notesBefore)
	}
	stop()
	if streams != nil {
		var toStream []float64
		streams.stop(b, &toStream)
		sum.toStream = append(sum.toStream, toStream...)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(b, lat, blockJobs, "each job handled once")
	return slices.Clone(lat)
}

// startListener runs a notify.Listener of its own until stop.
func startListener(tb testing.TB) (l *notify.Listener, stop func()) {
	cc, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(tb, err)
	l, err = notify.New(notify.Config{ConnConfig: cc})
	require.NoError(tb, err)
	return l, pgtest.RunInBackground(tb, "listener", l.Run)
}

// produceN enqueues n jobs, one per transaction, at rate per second on
// average: the i-th at i/rate seconds from the start, or at once when the
// producer is behind (a ticker would drop the ticks missed and lower the
// rate on a loaded machine).
func produceN(tb testing.TB, c *queue.Client, rate float64, n int) {
	tb.Helper()
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i) * float64(time.Second) / rate))))
		_, err := c.Enqueue(context.Background(), queue.NewJob{Queue: "load", Kind: "k", Payload: map[string]int64{"at": time.Now().UnixNano()}})
		require.NoError(tb, err)
	}
}

// uiMark marks a context whose statements are the dashboard's.
type uiMark struct{}

func markUI(ctx context.Context) context.Context { return context.WithValue(ctx, uiMark{}, true) }

// stmtCounter is a pgx tracer that counts the statements sent with a
// marked context (or all of them), their time from send to result, and
// their number by the statement's first words.
type stmtCounter struct {
	all   bool
	mu    sync.Mutex
	s     stmtSnap
	heads sync.Map // SQL -> sqlHead(SQL): the tracer's own cost kept small
}

// stmtSnap is what a stmtCounter counted, and its process's CPU time
// (getrusage) when taken.
type stmtSnap struct {
	CPU    time.Duration
	N      int64
	Dur    time.Duration
	BySQL  map[string]int64
	DurSQL map[string]time.Duration
}

func (a stmtSnap) plus(b stmtSnap) stmtSnap {
	r := stmtSnap{CPU: a.CPU + b.CPU, N: a.N + b.N, Dur: a.Dur + b.Dur, BySQL: map[string]int64{}, DurSQL: map[string]time.Duration{}}
	for _, x := range []stmtSnap{a, b} {
		for k, v := range x.BySQL {
			r.BySQL[k] += v
			r.DurSQL[k] += x.DurSQL[k]
		}
	}
	return r
}

func (a stmtSnap) minus(b stmtSnap) stmtSnap {
	r := stmtSnap{CPU: a.CPU - b.CPU, N: a.N - b.N, Dur: a.Dur - b.Dur, BySQL: maps.Clone(a.BySQL), DurSQL: maps.Clone(a.DurSQL)}
	for k, v := range b.BySQL {
		r.BySQL[k] -= v
		r.DurSQL[k] -= b.DurSQL[k]
	}
	return r
}

// top is the n most frequent statements.
func (a stmtSnap) top(n int) []string {
	keys := slices.Collect(maps.Keys(a.BySQL))
	slices.SortFunc(keys, func(x, y string) int { return int(a.BySQL[y] - a.BySQL[x]) })
	return keys[:min(n, len(keys))]
}

func newStmtCounter(all bool) *stmtCounter {
	return &stmtCounter{all: all, s: stmtSnap{BySQL: map[string]int64{}, DurSQL: map[string]time.Duration{}}}
}

type stmtStart struct {
	at  time.Time
	sql string
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !c.all && ctx.Value(uiMark{}) == nil {
		return ctx
	}
	head, ok := c.heads.Load(d.SQL)
	if !ok {
		head, _ = c.heads.LoadOrStore(d.SQL, sqlHead(d.SQL))
	}
	return context.WithValue(ctx, stmtStart{}, stmtStart{at: time.Now(), sql: head.(string)})
}

func (c *stmtCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	st, ok := ctx.Value(stmtStart{}).(stmtStart)
	if !ok {
		return
	}
	d := time.Since(st.at)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.N++
	c.s.Dur += d
	c.s.BySQL[st.sql]++
	c.s.DurSQL[st.sql] += d
}

func (c *stmtCounter) snapshot() stmtSnap {
	c.mu.Lock()
	defer c.mu.Unlock()
	return stmtSnap{CPU: readProcStats().CPU, N: c.s.N, Dur: c.s.Dur, BySQL: maps.Clone(c.s.BySQL), DurSQL: maps.Clone(c.s.DurSQL)}
}

// quotedName is a quoted identifier followed by a dot: a schema.
var quotedName = regexp.MustCompile(`"[^"]*"\.`)

// sqlHead names a statement: its white space folded, schema names
// dropped, its first 40 and last 50 characters.
func sqlHead(sql string) string {
	s := quotedName.ReplaceAllString(strings.Join(strings.Fields(sql), " "), "")
	if len(s) > 95 {
		s = s[:40] + " ... " + s[len(s)-50:]
	}
	return s
}

// p99 is the 99th percentile of xs (which it sorts).
func p99(xs []float64) float64 {
	slices.Sort(xs)
	return xs[int(math.Ceil(0.99*float64(len(xs))))-1]
}

// openStreams opens 10 streams on a dashboard's url, as 10 browser tabs,
// and returns what closes them; then *toStream holds the first stream's
// enqueued-event delays (ms).
func openStreams(tb testing.TB, url string, toStream *[]float64) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var streams []<-chan sseEvent
	for range 10 {
		streams = append(streams, stream(tb, ctx, url+"/events", ""))
	}
	done := make(chan []float64)
	go func() { done <- enqueuedDelays(streams[0]) }()
	return func() {
		cancel()
		*toStream = <-done
	}
}

// enqueuedDelays reads a stream until it closes and returns, for each
// enqueued event, the time from the event's insert to its arrival (ms).
func enqueuedDelays(events <-chan sseEvent) []float64 {
	var lat []float64
	for e := range events {
		var je struct {
			Type queue.EventType `json:"type"`
			At   time.Time       `json:"at"`
		}
		if e.event == "job" && json.Unmarshal([]byte(e.data), &je) == nil && je.Type == queue.EventEnqueued {
			lat = append(lat, float64(time.Since(je.At).Microseconds())/1000)
		}
	}
	return lat
}

// What TestDashboardProcess serves: a dashboard on a schema, or only the
// streams (the browser tabs) of a dashboard at a URL.
const (
	envDashboardSchema = "PGWAKE_UI_BENCH_SCHEMA"
	envStreamsURL      = "PGWAKE_UI_BENCH_STREAMS"
)

// TestDashboardProcess prints streamsReady once its streams are open,
// snapLine and its statement counts (JSON) for each line read from its
// standard input, and delayLine followed by its first stream's delays
// (JSON) at the end.
const (
	streamsReady = "streams open"
	snapLine     = "statements: "
	delayLine    = "delays: "
)

// helper is a running TestDashboardProcess.
type helper struct {
	done  bool
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// startHelper runs this test binary again as TestDashboardProcess with env
// (envDashboardSchema or envStreamsURL) and waits until its streams are
// open.
func startHelper(tb testing.TB, env string) *helper {
	args := []string{os.Args[0], "-test.run", "^TestDashboardProcess$", "-test.count", "1"}
	if n := os.Getenv(envBenchNice); n != "" {
		// The tabs (and a dashboard of its own) as if on other hosts: at a
		// lower CPU priority than the worker, the producer and PostgreSQL,
		// which share this machine's cores with them.
		_, err := strconv.ParseUint(n, 10, 8)
		require.NoError(tb, err, envBenchNice)
		args = append([]string{"nice", "-n", n}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), pgtest.EnvURL+"="+pgtest.URL(), env)
	stdin, err := cmd.StdinPipe()
	require.NoError(tb, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	cmd.Stderr = os.Stderr
	require.NoError(tb, cmd.Start())
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 1<<20), 64<<20)
	for lines.Scan() && lines.Text() != streamsReady {
	}
	return &helper{cmd: cmd, stdin: stdin, lines: lines}
}

// snap asks the process for the statements its dashboard sent so far.
func (h *helper) snap(tb testing.TB) stmtSnap {
	_, err := fmt.Fprintln(h.stdin)
	require.NoError(tb, err)
	for h.lines.Scan() {
		if d, ok := strings.CutPrefix(h.lines.Text(), snapLine); ok {
			var s stmtSnap
			require.NoError(tb, json.Unmarshal([]byte(d), &s))
			return s
		}
	}
	tb.Fatalf("the dashboard process ended: %v", h.lines.Err())
	return stmtSnap{}
}

// stop ends the process (once; later calls do nothing); then *toStream
// (unless nil) holds its first stream's enqueued-event delays (ms).
func (h *helper) stop(tb testing.TB, toStream *[]float64) {
	if h.done {
		return
	}
	h.done = true
	_ = h.stdin.Close()
	for h.lines.Scan() {
		if d, ok := strings.CutPrefix(h.lines.Text(), delayLine); ok && toStream != nil {
			require.NoError(tb, json.Unmarshal([]byte(d), toStream))
		}
	}
	require.NoError(tb, h.cmd.Wait(), "the dashboard process")
}

// TestDashboardProcess is BenchmarkDashboardLatencyImpact's other process:
// with envStreamsURL it opens 10 streams on that dashboard (the browser
// tabs); with envDashboardSchema it also serves the dashboard, on that
// schema, through a pool whose statements it counts. It runs until its
// standard input closes, and reports the first stream's delays. Without
// either variable (every ordinary test run) it is skipped.
func TestDashboardProcess(t *testing.T) {
	url, schema := os.Getenv(envStreamsURL), os.Getenv(envDashboardSchema)
	if load := loadSchema(); load != "" {
		pool := pgtest.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 20 })
		stop, done := make(chan struct{}), make(chan error, 1)
		go func() { done <- runLoad(t, pool, load, stop) }()
		fmt.Println(streamsReady)
		for in := bufio.NewScanner(os.Stdin); in.Scan(); {
			fmt.Println(snapLine + "{}")
		}
		close(stop)
		require.NoError(t, <-done, "the load")
		return
	}
	if url == "" && schema == "" {
		t.Skip("run by BenchmarkDashboardLatencyImpact")
	}
	counter := newStmtCounter(true)
	if schema != "" {
		pool := pgtest.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter })
		client, err := queue.New(pool, queue.Config{Schema: schema})
		require.NoError(t, err)
		url = setup(t, ui.Config{Client: client}).url
	}
	var toStream []float64
	stop := openStreams(t, url, &toStream)
	fmt.Println(streamsReady)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		out, err := json.Marshal(counter.snapshot())
		require.NoError(t, err)
		fmt.Println(snapLine + string(out))
	}
	stop()
	require.NotEmpty(t, toStream, "the streams saw the jobs")
	out, err := json.Marshal(toStream)
	require.NoError(t, err)
	fmt.Println(delayLine + string(out))
}
