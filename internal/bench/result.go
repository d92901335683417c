package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"time"
)

// Result is one mode's outcome for one system. Latency fields are in
// milliseconds and NaN where the mode has no latency (printed as "-" and as
// JSON null).
type Result struct {
	Mode   Mode
	System string
	// Case tells apart the results of one mode ("pending=10000"), or "".
	Case       string
	Jobs       int
	JobsPerSec float64
	P50        float64
	P90        float64
	P99        float64
	Max        float64
	Duplicates int64
	Missing    int64
	// Runs is how many runs the figures are the median of.
	Runs int
	// Extra holds mode-specific figures, by snake_case name.
	Extra map[string]float64
	// Samples are the latencies (ms) of the latency, idle and delayed modes,
	// for charts; from the median run. Not in JSON.
	Samples []float64
}

// key identifies a result across runs.
func (r Result) key() string { return string(r.Mode) + "\x00" + r.System + "\x00" + r.Case }

// MarshalJSON writes the fields in a fixed order: mode, system, case (when
// set), jobs, jobs_per_sec, p50_ms, p90_ms, p99_ms, max_ms, duplicates,
// missing, runs, then the extras sorted by name.
func (r Result) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	n := 0
	field := func(name string, v any) {
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		k, _ := json.Marshal(name)
		b.Write(k)
		b.WriteByte(':')
		if f, ok := v.(float64); ok {
			if math.IsNaN(f) || math.IsInf(f, 0) {
				b.WriteString("null")
				return
			}
			v = round3(f)
		}
		val, _ := json.Marshal(v)
		b.Write(val)
	}
	field("mode", string(r.Mode))
	field("system", r.System)
	if r.Case != "" {
		field("case", r.Case)
	}
	field("jobs", r.Jobs)
	field("jobs_per_sec", r.JobsPerSec)
	field("p50_ms", r.P50)
	field("p90_ms", r.P90)
	field("p99_ms", r.P99)
	field("max_ms", r.Max)
	field("duplicates", r.Duplicates)
	field("missing", r.Missing)
	field("runs", r.Runs)
	names := make([]string, 0, len(r.Extra))
	for k := range r.Extra {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		field(k, r.Extra[k])
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// Stats is a latency distribution summary in milliseconds.
type Stats struct {
	N                       int
	Min, P50, P90, P99, Max float64
}

// Summarize sorts ms in place and returns its nearest-rank percentiles. With
// no samples every figure is NaN.
func Summarize(ms []float64) Stats {
	if len(ms) == 0 {
		nan := math.NaN()
		return Stats{Min: nan, P50: nan, P90: nan, P99: nan, Max: nan}
	}
	sort.Float64s(ms)
	return Stats{
		N:   len(ms),
		Min: ms[0],
		P50: Percentile(ms, 0.50),
		P90: Percentile(ms, 0.90),
		P99: Percentile(ms, 0.99),
		Max: ms[len(ms)-1],
	}
}

// Percentile returns the nearest-rank p-quantile (0 < p <= 1) of sorted.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// withStats copies s's percentiles into r.
func (r *Result) withStats(s Stats) {
	r.P50, r.P90, r.P99, r.Max = s.P50, s.P90, s.P99, s.Max
}

func noLatency(r *Result) {
	nan := math.NaN()
	r.P50, r.P90, r.P99, r.Max = nan, nan, nan, nan
}

// Median combines the results of several runs: for each (mode, system,
// case) the median of every figure; duplicates and missing are summed, so
// any loss in any run shows. Samples come from the run whose p50 is the
// median. The order is that of the first run.
func Median(runs [][]Result) []Result {
	groups := map[string][]Result{}
	var order []string
	for _, run := range runs {
		for _, r := range run {
			k := r.key()
			if _, ok := groups[k]; !ok {
				order = append(order, k)
			}
			groups[k] = append(groups[k], r)
		}
	}
	out := make([]Result, 0, len(order))
	for _, k := range order {
		g := groups[k]
		m := g[0]
		m.Runs = len(g)
		pick := func(f func(Result) float64) float64 {
			v := make([]float64, 0, len(g))
			for _, r := range g {
				if x := f(r); !math.IsNaN(x) {
					v = append(v, x)
				}
			}
			return median(v)
		}
		m.JobsPerSec = pick(func(r Result) float64 { return r.JobsPerSec })
		m.P50 = pick(func(r Result) float64 { return r.P50 })
		m.P90 = pick(func(r Result) float64 { return r.P90 })
		m.P99 = pick(func(r Result) float64 { return r.P99 })
		m.Max = pick(func(r Result) float64 { return r.Max })
		m.Jobs = int(pick(func(r Result) float64 { return float64(r.Jobs) }))
		m.Duplicates, m.Missing = 0, 0
		for _, r := range g {
			m.Duplicates += r.Duplicates
			m.Missing += r.Missing
		}
		m.Extra = map[string]float64{}
		for name := range g[0].Extra {
			m.Extra[name] = pick(func(r Result) float64 {
				if v, ok := r.Extra[name]; ok {
					return v
				}
				return math.NaN()
			})
		}
		// Samples of the run closest to the median p50.
		best := math.Inf(1)
		for _, r := range g {
			if d := math.Abs(r.P50 - m.P50); d < best || math.IsNaN(d) && best == math.Inf(1) {
				best, m.Samples = d, r.Samples
			}
		}
		out = append(out, m)
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
