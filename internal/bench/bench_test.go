package bench_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/bench"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// tiny are sizes that run every mode in a few seconds.
func tiny() bench.Sizes {
	return bench.Sizes{
		DrainJobs:           300,
		Rate:                100,
		LatencyDuration:     time.Second,
		IdleInterval:        100 * time.Millisecond,
		IdleDuration:        500 * time.Millisecond,
		DelayedJobs:         20,
		DelayedSpread:       time.Second,
		Producers:           4,
		EnqueueDuration:     time.Second,
		ScaleSmall:          100,
		ScaleLarge:          400,
		ScaleFinished:       1000,
		BatchSize:           150,
		IdleTimeout:         20 * time.Second,
		ScheduledJobs:       500,
		ScheduledFailed:     400,
		HousekeepingSmall:   200,
		HousekeepingLarge:   800,
		HousekeepingExpired: 300,
		QueuesJobs:          3000,
	}
}

func TestEveryModeRunsPgwakeExactlyOnce(t *testing.T) {
	var out, log bytes.Buffer
	results, err := bench.Run(context.Background(), bench.Options{
		DatabaseURL: pgtest.URL(),
		Sizes:       tiny(),
		Workers:     4,
		Out:         &out,
		Log:         &log,
		JSON:        true,
		Commit:      "test",
	}, &bench.Pgwake{})
	require.NoError(t, err, "log:\n%s", log.String())

	// One JSON object per line, one per result, with the fields.
	var lines []map[string]any
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		for _, f := range []string{"mode", "system", "jobs", "jobs_per_sec", "p50_ms", "p90_ms", "p99_ms", "max_ms", "duplicates", "missing"} {
			require.Contains(t, m, f, sc.Text())
		}
		lines = append(lines, m)
	}
	require.Len(t, lines, len(results))

	got := map[string]bench.Result{}
	for _, r := range results {
		got[string(r.Mode)+" "+r.Case] = r
		require.Equal(t, "pgwake", r.System)
		require.Zero(t, r.Duplicates, "%s %s", r.Mode, r.Case)
		require.Zero(t, r.Missing, "%s %s", r.Mode, r.Case)
		require.Positive(t, r.JobsPerSec, "%s %s", r.Mode, r.Case)
	}
	require.Len(t, results, 14, "drain, latency, idle, delayed, enqueue, three scale cases, three scheduled, two housekeeping and queues")

	require.Equal(t, 300, got["drain "].Jobs)
	require.True(t, math.IsNaN(got["drain "].P50), "drain has no latency")
	// The start is inside the drain's time.
	dr := got["drain "].Extra
	require.Positive(t, dr["start_ms"])
	require.Positive(t, dr["first_start_ms"])
	require.Less(t, dr["first_start_ms"], dr["seconds"]*1000)
	require.Equal(t, 100, got["latency "].Jobs)
	require.Equal(t, 5, got["idle "].Jobs)
	for _, m := range []string{"latency ", "idle ", "delayed "} {
		r := got[m]
		require.False(t, math.IsNaN(r.P50), m)
		require.LessOrEqual(t, r.P50, r.P90, m)
		require.LessOrEqual(t, r.P90, r.P99, m)
		require.LessOrEqual(t, r.P99, r.Max, m)
	}
	require.Zero(t, got["delayed "].Extra["early"], "no delayed job may start before its run_after")
	enq := got["enqueue "]
	require.Positive(t, enq.Jobs)
	require.Positive(t, enq.Extra["baseline_per_sec"])
	require.InDelta(t, enq.JobsPerSec/enq.Extra["baseline_per_sec"], enq.Extra["ratio_vs_baseline"], 1e-9)
	fin := got["scale pending=100 finished=1000"]
	require.Equal(t, 100, fin.Jobs)
	require.Equal(t, 1000.0, fin.Extra["finished"])
	require.Positive(t, fin.Extra["max_rss_mib"])
	sch := got["scheduled scheduled=500"]
	require.Equal(t, 100, sch.Jobs)
	require.False(t, math.IsNaN(sch.P99))
	require.InDelta(t, sch.P99/got["scheduled scheduled=0"].P99, sch.Extra["p99_ratio"], 1e-9)
	kept := got["scheduled scheduled=500,failed=400"]
	require.Equal(t, 100, kept.Jobs)
	require.Equal(t, 400.0, kept.Extra["failed_kept"])
	require.False(t, math.IsNaN(kept.P99))
	require.InDelta(t, kept.P99/got["scheduled scheduled=0"].P99, kept.Extra["p99_ratio"], 1e-9)
	for _, c := range []string{"kept=200", "kept=800"} {
		hk := got["housekeeping "+c]
		require.Equal(t, 300, hk.Jobs, c)
		require.Positive(t, hk.Extra["retention_batch_ms"], c)
		require.Positive(t, hk.Extra["prune_batch_ms"], c)
	}
	require.Contains(t, got["housekeeping kept=800"].Extra, "retention_ratio")
	require.Contains(t, got["housekeeping kept=800"].Extra, "prune_ratio")
	qs := got["queues "]
	require.Equal(t, 3000, qs.Jobs)
	require.Positive(t, qs.Extra["baseline_ms"])
	require.InDelta(t, qs.Extra["baseline_ms"]/qs.Extra["enqueue_ms"], qs.Extra["ratio"], 1e-9)
}

// TestSQLEnqueueVariant runs the enqueue mode through the SQL API
// (pgwake-sql): it runs that mode only, and every acknowledged enqueue is in
// the table once.
func TestSQLEnqueueVariant(t *testing.T) {
	sys := &bench.Pgwake{SQL: true}
	require.Equal(t, bench.SQLSystem, sys.Name())
	require.False(t, sys.Supports(bench.ModeDrain))
	var log bytes.Buffer
	sizes := tiny()
	sizes.EnqueueDuration = 400 * time.Millisecond
	results, err := bench.Run(context.Background(), bench.Options{
		DatabaseURL: pgtest.URL(), Modes: []bench.Mode{bench.ModeEnqueue, bench.ModeDrain},
		Sizes: sizes, Workers: 2, Out: io.Discard, Log: &log, Commit: "test",
	}, sys)
	require.NoError(t, err, "log:\n%s", log.String())
	require.Len(t, results, 1, "enqueue only")
	r := results[0]
	require.Equal(t, bench.SQLSystem, r.System)
	require.Positive(t, r.Jobs)
	require.Zero(t, r.Duplicates)
	require.Zero(t, r.Missing)
}

// TestInsertFailedKeepsJobsInsideRetention: the scheduled mode's failed
// backlog is failed jobs that finished 1 to 6 days ago, which the default
// retention keeps.
func TestInsertFailedKeepsJobsInsideRetention(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	sys := &bench.Pgwake{}
	require.NoError(t, sys.Setup(ctx, &bench.Env{Pool: pool, Workers: 2, Logf: t.Logf}))
	t.Cleanup(func() { _ = sys.Teardown(context.Background()) })
	require.NoError(t, sys.InsertFailed(ctx, 60))
	page, err := sys.Client().JobList(ctx, queue.JobListParams{State: queue.StateFailed, Limit: 100})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 60)
	now := time.Now()
	for _, j := range page.Jobs {
		require.NotNil(t, j.FinishedAt)
		age := now.Sub(*j.FinishedAt)
		require.True(t, age >= 24*time.Hour-time.Minute && age <= 6*24*time.Hour+time.Minute, "job %d finished %v ago", j.ID, age)
	}
	deleted, err := sys.Client().DeleteFinished(ctx, queue.Retention{})
	require.NoError(t, err)
	require.Zero(t, deleted[queue.StateFailed], "the default retention keeps them")
}

// faulty wraps pgwake and misreports handler starts: job 0 twice, job 1
// never. The modes must count both.
type faulty struct{ bench.Pgwake }

func (f *faulty) Name() string { return "faulty" }

func (f *faulty) Start(ctx context.Context, handle bench.HandleFunc) (func() error, error) {
	return f.Pgwake.Start(ctx, func(seq int64) {
		switch seq {
		case 0:
			handle(0)
			handle(0)
		case 1:
		default:
			handle(seq)
		}
	})
}

func TestDuplicatesAndMissingAreReported(t *testing.T) {
	s := tiny()
	s.IdleTimeout = 2 * time.Second
	var out bytes.Buffer
	results, err := bench.Run(context.Background(), bench.Options{
		DatabaseURL: pgtest.URL(), Sizes: s, Workers: 2, Out: &out, Log: &bytes.Buffer{},
		Modes: []bench.Mode{bench.ModeDrain, bench.ModeIdle},
	}, &faulty{})
	require.NoError(t, err)
	require.Len(t, results, 2)
	for _, r := range results {
		require.Equal(t, int64(1), r.Duplicates, r.Mode)
		require.Equal(t, int64(1), r.Missing, r.Mode)
	}
	require.Contains(t, out.String(), "exactly once: faulty drain")
	require.Contains(t, out.String(), "NOT MET")
}

func TestSummarizeAndPercentile(t *testing.T) {
	v := make([]float64, 0, 100)
	for i := 100; i >= 1; i-- {
		v = append(v, float64(i))
	}
	s := bench.Summarize(v)
	require.Equal(t, bench.Stats{N: 100, Min: 1, P50: 50, P90: 90, P99: 99, Max: 100}, s)
	require.Equal(t, 7.0, bench.Percentile([]float64{7}, 0.99))
	require.True(t, math.IsNaN(bench.Summarize(nil).P50))
}

func TestMedianOfRuns(t *testing.T) {
	mk := func(jps, p50 float64, dup int64) bench.Result {
		return bench.Result{Mode: bench.ModeLatency, System: "pgwake", Jobs: 10, JobsPerSec: jps, P50: p50,
			P90: p50, P99: p50, Max: p50, Duplicates: dup, Extra: map[string]float64{"x": jps}, Samples: []float64{p50}}
	}
	m := bench.Median([][]bench.Result{{mk(100, 3, 0)}, {mk(300, 1, 1)}, {mk(200, 2, 0)}})
	require.Len(t, m, 1)
	require.Equal(t, 200.0, m[0].JobsPerSec)
	require.Equal(t, 2.0, m[0].P50)
	require.Equal(t, 200.0, m[0].Extra["x"])
	require.Equal(t, int64(1), m[0].Duplicates, "duplicates of every run add up")
	require.Equal(t, 3, m[0].Runs)
	require.Equal(t, []float64{2}, m[0].Samples, "samples of the median run")
}

func TestResultJSON(t *testing.T) {
	r := bench.Result{Mode: bench.ModeDrain, System: "pgwake", Jobs: 5, JobsPerSec: 1234.56789,
		P50: math.NaN(), P90: math.NaN(), P99: math.NaN(), Max: math.NaN(), Runs: 1,
		Extra: map[string]float64{"seconds": 0.5, "insert_per_sec": 10}}
	b, err := json.Marshal(r)
	require.NoError(t, err)
	require.Equal(t, `{"mode":"drain","system":"pgwake","jobs":5,"jobs_per_sec":1234.568,"p50_ms":null,"p90_ms":null,"p99_ms":null,"max_ms":null,"duplicates":0,"missing":0,"runs":1,"insert_per_sec":10,"seconds":0.5}`, string(b))
}

func TestParseModes(t *testing.T) {
	m, err := bench.ParseModes("scale, drain,drain")
	require.NoError(t, err)
	require.Equal(t, []bench.Mode{bench.ModeDrain, bench.ModeScale}, m)
	m, err = bench.ParseModes("all")
	require.NoError(t, err)
	require.Equal(t, bench.AllModes, m)
	for _, bad := range []string{"", " , ", "drain,fast"} {
		_, err := bench.ParseModes(bad)
		require.ErrorIs(t, err, bench.ErrUnknownMode, bad)
	}
}

func TestBadOptionsAreRejectedBeforeAnyWork(t *testing.T) {
	for name, o := range map[string]bench.Options{
		"workers":  {Workers: -1},
		"runs":     {Runs: 1000},
		"rate":     {Sizes: bench.Sizes{Rate: -5}},
		"producer": {Sizes: bench.Sizes{Producers: -1}},
		"idle":     {Sizes: bench.Sizes{IdleInterval: time.Second, IdleDuration: time.Millisecond}},
		"url":      {DatabaseURL: "postgres://a b"},
		"lease":    {Sizes: bench.Sizes{ConcurrentLease: 50 * time.Millisecond}},
	} {
		o.Out, o.Log = &bytes.Buffer{}, &bytes.Buffer{}
		_, err := bench.Run(context.Background(), o, &bench.Pgwake{})
		require.Error(t, err, name)
		require.True(t, errors.Is(err, bench.ErrInvalidOptions) || errors.Is(err, bench.ErrInvalidSizes), "%s: %v", name, err)
	}
}

// peer is a named stand-in for rendering tests; it never runs.
type peer struct{ bench.Pgwake }

func (p *peer) Name() string { return p.Label }

func TestReportRatiosChartAndTargets(t *testing.T) {
	nan := math.NaN()
	res := func(mode bench.Mode, sys string, jps, p50, p99 float64) bench.Result {
		return bench.Result{Mode: mode, System: sys, Jobs: 100, JobsPerSec: jps, P50: p50, P90: p50, P99: p99, Max: p99 * 2, Runs: 1,
			Extra: map[string]float64{}}
	}
	enq := res(bench.ModeEnqueue, "pgwake", 9000, 2, 5)
	enq.Extra = map[string]float64{"baseline_per_sec": 10000, "ratio_vs_baseline": 0.9, "producers": 16}
	enqSQL := res(bench.ModeEnqueue, bench.SQLSystem, 8500, 2, 5) // 0.944x the Go client
	rep := bench.Report{
		Systems: []bench.System{&bench.Pgwake{}, &bench.Pgwake{SQL: true}, &peer{bench.Pgwake{Label: "river-tuned"}}, &peer{bench.Pgwake{Label: "river-default"}}},
		Results: []bench.Result{
			res(bench.ModeDrain, "pgwake", 30000, nan, nan),
			res(bench.ModeDrain, "river-tuned", 10000, nan, nan),
			res(bench.ModeLatency, "pgwake", 200, 0.7, 2),
			res(bench.ModeLatency, "river-tuned", 200, 1.0, 2.5),
			res(bench.ModeLatency, "river-default", 200, 50, 100),
			res(bench.ModeDelayed, "pgwake", 20, 1, 12),
			enq, enqSQL,
		},
		Commit: "abc", Workers: 10, Runs: 1,
	}
	var b strings.Builder
	rep.WriteText(&b)
	txt := b.String()
	require.Contains(t, txt, "ratios pgwake / peer")
	require.Regexp(t, `drain\s+river-tuned\s+3\.00x`, txt)
	require.Regexp(t, `latency\s+river-default\s+1\.00x\s+0\.014x`, txt)

	met := map[string]bool{}
	for _, tg := range rep.Targets() {
		met[tg.What] = tg.Met
	}
	require.Equal(t, map[string]bool{
		"latency p50 <= 0.75x river-tuned":                   true,  // 0.7
		"latency p99 <= 0.75x river-tuned":                   false, // 0.8
		"latency p50 <= 0.1x river-default":                  true,
		"latency p99 <= 0.1x river-default":                  true,
		"drain jobs/s >= 1.5x river-tuned":                   true,
		"delayed lateness p99 < 10 ms":                       false,
		"enqueue (16 producers) >= 0.9x plain INSERT":        true,
		"enqueue through the SQL API >= 0.95x the Go client": false,
	}, met)
	require.Regexp(t, `enqueue\s+pgwake-sql\s+1\.06x`, txt)

	chart := rep.TextChart()
	require.Contains(t, chart, "river-default")
	require.Contains(t, chart, "p50 50.0 p99 100 max 200 ms")
	svg := rep.SVG()
	require.True(t, strings.HasPrefix(svg, "<svg "), svg[:20])
	require.Contains(t, svg, ">river-tuned</text>")
	require.Equal(t, strings.Count(svg, "<svg"), strings.Count(svg, "</svg>"))
}

// counting wraps leased pgwake and records when each handler starts and
// when the mode counts unfinished jobs.
type counting struct {
	bench.Pgwake
	mu        sync.Mutex
	lastStart time.Time
	counts    []time.Time
}

func (c *counting) Start(ctx context.Context, handle bench.HandleFunc) (func() error, error) {
	return c.Pgwake.Start(ctx, func(seq int64) {
		c.mu.Lock()
		c.lastStart = time.Now()
		c.mu.Unlock()
		handle(seq)
	})
}

func (c *counting) Unfinished(ctx context.Context) (int64, error) {
	c.mu.Lock()
	c.counts = append(c.counts, time.Now())
	c.mu.Unlock()
	return c.Pgwake.Unfinished(ctx)
}

// The concurrent mode counts unfinished jobs only once the last job's
// handler may have ended (its start plus the sleep every handler takes):
// earlier counts cannot end the run and load the database whose
// completions it measures.
func TestConcurrentModeCountsOnlyOnceTheLastJobMayHaveEnded(t *testing.T) {
	s := tiny()
	s.ConcurrentJobs, s.ConcurrentSleep, s.ConcurrentPool = 50, 300*time.Millisecond, 5
	sys := &counting{Pgwake: bench.Pgwake{Leased: true}}
	results, err := bench.Run(context.Background(), bench.Options{
		DatabaseURL: pgtest.URL(), Sizes: s, Out: &bytes.Buffer{}, Log: &bytes.Buffer{},
		Modes: []bench.Mode{bench.ModeConcurrent},
	}, sys)
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.Zero(t, results[0].Missing)
	sys.mu.Lock()
	defer sys.mu.Unlock()
	require.NotEmpty(t, sys.counts)
	require.False(t, sys.counts[0].Before(sys.lastStart.Add(s.ConcurrentSleep)),
		"first count %v after the last start, before the sleep of %v", sys.counts[0].Sub(sys.lastStart), s.ConcurrentSleep)
}

// With a short lease (ConcurrentLease) the concurrent mode's leased jobs are
// extended while they sleep, and the run reports the heartbeat's
// statements and their time.
func TestConcurrentModeReportsTheLeaseHeartbeat(t *testing.T) {
	s := tiny()
	s.ConcurrentJobs, s.ConcurrentSleep, s.ConcurrentPool = 50, 900*time.Millisecond, 5
	s.ConcurrentLease = 300 * time.Millisecond // extended every 100 ms
	results, err := bench.Run(context.Background(), bench.Options{
		DatabaseURL: pgtest.URL(), Sizes: s, Out: &bytes.Buffer{}, Log: &bytes.Buffer{},
		Modes: []bench.Mode{bench.ModeConcurrent},
	}, &bench.Pgwake{Leased: true})
	require.NoError(t, err)
	require.Len(t, results, 1)
	r := results[0]
	require.Zero(t, r.Missing)
	require.Zero(t, r.Duplicates)
	require.GreaterOrEqual(t, r.Extra["lease_heartbeats"], 3.0, "extras %v", r.Extra)
	require.Greater(t, r.Extra["lease_heartbeat_ms_total"], 0.0)
}

// The latency modes' producers default to max(4, ceil(rate/250)): 4 up to
// 1,000 jobs/s, more above; --latency-producers sets them.
func TestLatencyProducersFollowTheRate(t *testing.T) {
	for args, want := range map[string]int{
		"":                                  4,
		"--rate 1000":                       4,
		"--rate 1001":                       5,
		"--rate 3000":                       12,
		"--rate 3000 --latency-producers 2": 2,
	} {
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		opts := bench.Flags(fs)
		require.NoError(t, fs.Parse(strings.Fields(args)), args)
		o, err := opts()
		require.NoError(t, err, args)
		require.Equal(t, want, o.Sizes.LatencyProducers, args)
	}
}
