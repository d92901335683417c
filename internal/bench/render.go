package bench

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Report is a run's results with what is needed to print them.
type Report struct {
	Results []Result
	// Systems in run order; the first is the one ratios are taken for.
	Systems []System
	Commit  string
	Server  string
	Workers int
	Sizes   Sizes
	Runs    int
	// Load describes the machine's load during the run.
	Load string
}

// WriteText prints the results table, then, with more than one system, the
// ratios of the first system to each other one; then the latency chart and
// the targets.
func (rep Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "pgwake bench: commit %s; %s; workers %d; median of %d run(s); %s\n",
		orDash(rep.Commit), orDash(rep.Server), rep.Workers, rep.Runs, orDash(rep.Load))
	for _, s := range rep.Systems {
		fmt.Fprintf(w, "  %-18s %s\n", s.Name(), s.Config())
	}
	fmt.Fprintln(w)
	rep.writeTable(w)
	if len(rep.Systems) > 1 {
		fmt.Fprintln(w)
		rep.writeRatios(w)
	}
	if chart := rep.TextChart(); chart != "" {
		fmt.Fprintln(w)
		fmt.Fprint(w, chart)
	}
	if ts := rep.Targets(); len(ts) > 0 {
		fmt.Fprintln(w)
		writeTargets(w, ts)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (rep Report) writeTable(w io.Writer) {
	rows := [][]string{{"mode", "system", "jobs", "jobs/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "dup", "missing", "notes"}}
	for _, r := range rep.Results {
		rows = append(rows, []string{caseName(r), r.System, strconv.Itoa(r.Jobs), num(r.JobsPerSec), num(r.P50), num(r.P90),
			num(r.P99), num(r.Max), strconv.FormatInt(r.Duplicates, 10), missing(r.Missing), notes(r)})
	}
	writeAligned(w, rows, 2)
}

func caseName(r Result) string {
	if r.Case != "" {
		return string(r.Mode) + " " + r.Case
	}
	return string(r.Mode)
}

// writeAligned prints rows as columns: the first nLeft left-aligned, the
// others right-aligned except the last, which is left as is.
func writeAligned(w io.Writer, rows [][]string, nLeft int) {
	var width []int
	for _, row := range rows {
		for i, c := range row {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			switch {
			case i == len(row)-1 && i >= nLeft:
				b.WriteString(c)
			case i < nLeft:
				b.WriteString(c + pad)
			default:
				b.WriteString(pad + c)
			}
			if i < len(row)-1 {
				b.WriteString("  ")
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

func missing(n int64) string {
	if n < 0 {
		return "?"
	}
	return strconv.FormatInt(n, 10)
}

// notes lists a result's extras as name=value.
func notes(r Result) string {
	names := make([]string, 0, len(r.Extra))
	for k := range r.Extra {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k + "=" + num(r.Extra[k]))
	}
	return b.String()
}

// num formats a figure with about three significant digits; NaN is "-".
func num(f float64) string {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return "-"
	case f == 0:
		return "0"
	case math.Abs(f) >= 100:
		return strconv.FormatFloat(f, 'f', 0, 64)
	case math.Abs(f) >= 10:
		return strconv.FormatFloat(f, 'f', 1, 64)
	case math.Abs(f) >= 1:
		return strconv.FormatFloat(f, 'f', 2, 64)
	}
	return strconv.FormatFloat(f, 'f', 3, 64)
}

// find returns the result of mode/system/case.
func (rep Report) find(mode Mode, system, cas string) (Result, bool) {
	for _, r := range rep.Results {
		if r.Mode == mode && r.System == system && r.Case == cas {
			return r, true
		}
	}
	return Result{}, false
}

// writeRatios prints, for each peer and mode, the first system's figure
// divided by the peer's: jobs/s (higher is better for the first system)
// and latencies (lower is better).
func (rep Report) writeRatios(w io.Writer) {
	first := rep.Systems[0].Name()
	fmt.Fprintf(w, "ratios %s / peer (jobs/s: above 1 is faster; latencies: below 1 is faster)\n", first)
	rows := [][]string{{"mode", "peer", "jobs/s", "p50", "p90", "p99", "max"}}
	for _, r := range rep.Results {
		if r.System != first {
			continue
		}
		for _, peer := range rep.Systems[1:] {
			p, ok := rep.find(r.Mode, peer.Name(), r.Case)
			if !ok {
				continue
			}
			rows = append(rows, []string{caseName(r), peer.Name(), ratio(r.JobsPerSec, p.JobsPerSec),
				ratio(r.P50, p.P50), ratio(r.P90, p.P90), ratio(r.P99, p.P99), ratio(r.Max, p.Max)})
		}
	}
	writeAligned(w, rows, 2)
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "-"
	}
	return num(a/b) + "x"
}

// Target is one of the performance targets, evaluated on a report.
type Target struct {
	What  string // "latency p50 <= 0.75x river-tuned"
	Value string // the measured figure or ratio
	Met   bool
}

// Targets evaluates the targets for system "pgwake" against
// "river-default" and "river-tuned", where those results exist.
func (rep Report) Targets() []Target {
	var ts []Target
	ts = append(ts, rep.peerTargets()...)
	ts = append(ts, rep.modeTargets()...)
	ts = append(ts, rep.scaleTargets()...)
	return append(ts, rep.resultTargets()...)
}

// peerTargets compare pgwake's latency, idle and drain with River's.
func (rep Report) peerTargets() []Target {
	var ts []Target
	pg := "pgwake"
	for _, peer := range []struct {
		name  string
		limit float64
	}{{"river-tuned", 0.75}, {"river-default", 0.1}} {
		a, ok1 := rep.find(ModeLatency, pg, "")
		b, ok2 := rep.find(ModeLatency, peer.name, "")
		if ok1 && ok2 {
			for _, q := range []struct {
				name string
				x, y float64
			}{{"p50", a.P50, b.P50}, {"p99", a.P99, b.P99}} {
				r := q.x / q.y
				ts = append(ts, Target{fmt.Sprintf("latency %s <= %gx %s", q.name, peer.limit, peer.name),
					fmt.Sprintf("%sx (%s vs %s ms)", num(r), num(q.x), num(q.y)), r <= peer.limit})
			}
		}
	}
	if a, ok := rep.find(ModeIdle, pg, ""); ok {
		if b, ok := rep.find(ModeIdle, "river-tuned", ""); ok {
			ts = append(ts, Target{"idle p50 <= river-tuned's", fmt.Sprintf("%s vs %s ms", num(a.P50), num(b.P50)), a.P50 <= b.P50})
		}
	}
	if a, ok := rep.find(ModeDrain, pg, ""); ok {
		if b, ok := rep.find(ModeDrain, "river-tuned", ""); ok {
			r := a.JobsPerSec / b.JobsPerSec
			ts = append(ts, Target{"drain jobs/s >= 1.5x river-tuned", fmt.Sprintf("%sx (%s vs %s/s)", num(r), num(a.JobsPerSec), num(b.JobsPerSec)), r >= 1.5})
		}
	}
	return ts
}

// modeTargets are the delayed and enqueue targets.
func (rep Report) modeTargets() []Target {
	var ts []Target
	pg := "pgwake"
	if a, ok := rep.find(ModeDelayed, pg, ""); ok {
		ts = append(ts, Target{"delayed lateness p99 < 10 ms", num(a.P99) + " ms", a.P99 < 10})
	}
	if a, ok := rep.find(ModeEnqueue, SQLSystem, ""); ok {
		if b, ok := rep.find(ModeEnqueue, pg, ""); ok {
			r := a.JobsPerSec / b.JobsPerSec
			ts = append(ts, Target{"enqueue through the SQL API >= 0.95x the Go client", fmt.Sprintf("%sx (%s vs %s/s)", num(r), num(a.JobsPerSec), num(b.JobsPerSec)), r >= 0.95})
		}
	}
	if a, ok := rep.find(ModeEnqueue, pg, ""); ok {
		r := a.Extra["ratio_vs_baseline"]
		ts = append(ts, Target{fmt.Sprintf("enqueue (%.0f producers) >= 0.9x plain INSERT", a.Extra["producers"]), fmt.Sprintf("%sx (%s vs %s/s)", num(r), num(a.JobsPerSec), num(a.Extra["baseline_per_sec"])), r >= 0.9})
	}
	return ts
}

// scaleTargets compare each scale case with the first.
func (rep Report) scaleTargets() []Target {
	var ts []Target
	pg := "pgwake"
	var small Result
	haveSmall := false
	for _, r := range rep.Results {
		if r.Mode != ModeScale || r.System != pg {
			continue
		}
		if !haveSmall {
			small, haveSmall = r, true
			continue
		}
		q := r.JobsPerSec / small.JobsPerSec
		ts = append(ts, Target{"scale " + r.Case + " >= 0.8x " + small.Case, fmt.Sprintf("%sx (%s vs %s/s)", num(q), num(r.JobsPerSec), num(small.JobsPerSec)), q >= 0.8})
	}
	return ts
}

// resultTargets are the targets read from single results: scheduled,
// queues, housekeeping, memory, and exactly once for every system.
func (rep Report) resultTargets() []Target {
	var ts []Target
	pg := "pgwake"
	for _, r := range rep.Results {
		if r.System != pg {
			continue
		}
		if q, ok := r.Extra["p99_ratio"]; ok && r.Mode == ModeScheduled {
			ts = append(ts, Target{"scheduled p99 " + r.Case + " <= 1.2x scheduled=0", num(q) + "x", q <= 1.2})
		}
		if r.Mode == ModeQueues {
			ts = append(ts, Target{fmt.Sprintf("one enqueue of %d jobs over as many queues succeeds", r.Jobs),
				fmt.Sprintf("%s ms, %d missing (plain INSERT %s ms)", num(r.Extra["enqueue_ms"]), r.Missing, num(r.Extra["baseline_ms"])), r.Missing == 0})
		}
		for _, k := range []string{"retention", "prune"} {
			if q, ok := r.Extra[k+"_ratio"]; ok && r.Mode == ModeHousekeeping {
				ts = append(ts, Target{"housekeeping " + k + " per batch " + r.Case + " <= 1.5x", num(q) + "x", q <= 1.5})
			}
		}
	}
	for _, r := range rep.Results {
		if r.System != pg || (r.Mode != ModeScale && r.Mode != ModeDrain) {
			continue
		}
		if rss, ok := r.Extra["max_rss_mib"]; ok && rss > 0 && r.Jobs >= 100000 {
			ts = append(ts, Target{fmt.Sprintf("memory draining %d jobs < 100 MiB RSS (bench process)", r.Jobs), num(rss) + " MiB", rss < 100})
		}
	}
	for _, r := range rep.Results {
		if r.Duplicates != 0 || r.Missing > 0 {
			ts = append(ts, Target{fmt.Sprintf("exactly once: %s %s %s", r.System, r.Mode, r.Case),
				fmt.Sprintf("%d duplicates, %d missing", r.Duplicates, r.Missing), false})
		}
	}
	return ts
}

func writeTargets(w io.Writer, ts []Target) {
	fmt.Fprintln(w, "targets")
	rows := make([][]string, 0, len(ts))
	for _, t := range ts {
		met := "NOT MET"
		if t.Met {
			met = "met"
		}
		rows = append(rows, []string{t.What, t.Value, met})
	}
	writeAligned(w, rows, 3)
}

// chartModes are the modes with a latency distribution, and their titles.
var chartModes = []struct {
	mode  Mode
	title string
}{
	{ModeLatency, "latency at the configured rate: enqueue commit to handler start"},
	{ModeIdle, "idle (one job at a time): enqueue commit to handler start"},
	{ModeDelayed, "delayed: handler start after run_after"},
}

// log axis of the charts: 0.1 ms .. 10 s.
const (
	axisMin = 0.1
	axisMax = 10000.0
)

func axisPos(ms float64, width int) int {
	if math.IsNaN(ms) {
		return -1
	}
	ms = min(max(ms, axisMin), axisMax)
	f := math.Log10(ms/axisMin) / math.Log10(axisMax/axisMin)
	return int(math.Round(f * float64(width-1)))
}

// TextChart draws, per latency mode, one line per system on a log scale:
// [ marks p50, ] marks p99, = fills between them, 9 is p90, and a line of
// dots runs to M, the maximum. Empty when no result has a latency.
func (rep Report) TextChart() string {
	const width = 61 // 12 columns per decade
	var b strings.Builder
	for _, cm := range chartModes {
		var rows []Result
		for _, r := range rep.Results {
			if r.Mode == cm.mode && !math.IsNaN(r.P50) {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		nameW := 0
		for _, r := range rows {
			nameW = max(nameW, len(r.System))
		}
		fmt.Fprintf(&b, "%s (log scale; [ p50, 9 p90, ] p99, M max)\n", cm.title)
		fmt.Fprintf(&b, "%-*s %s\n", nameW, "", axisLabels(width))
		for _, r := range rows {
			line := []rune(strings.Repeat(" ", width))
			for i := 0; i < width; i += 12 {
				line[i] = '|'
			}
			p50, p90, p99, mx := axisPos(r.P50, width), axisPos(r.P90, width), axisPos(r.P99, width), axisPos(r.Max, width)
			for i := p99 + 1; i < mx; i++ {
				line[i] = '.'
			}
			for i := p50; i <= p99; i++ {
				line[i] = '='
			}
			line[p50] = '['
			line[p99] = ']'
			if p90 > p50 && p90 < p99 {
				line[p90] = '9'
			}
			if mx > p99 {
				line[mx] = 'M'
			}
			fmt.Fprintf(&b, "%-*s %s  p50 %s p99 %s max %s ms\n", nameW, r.System, string(line), num(r.P50), num(r.P99), num(r.Max))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func axisLabels(width int) string {
	line := []rune(strings.Repeat(" ", width+6))
	for i, l := range []string{"0.1ms", "1ms", "10ms", "100ms", "1s", "10s"} {
		copy(line[i*12:], []rune(l))
	}
	return strings.TrimRight(string(line), " ")
}

// SVG draws the latency chart as an SVG document: per latency mode a panel,
// per system a row with a bar from p50 to p99, a tick at p90 and a
// whisker to the maximum, on a log axis from 0.1 ms to 10 s.
func (rep Report) SVG() string {
	const (
		left, right = 150.0, 760.0 // axis span in px
		rowH        = 22.0
		width       = 900.0
	)
	x := func(ms float64) float64 {
		ms = min(max(ms, axisMin), axisMax)
		return left + (right-left)*math.Log10(ms/axisMin)/math.Log10(axisMax/axisMin)
	}
	var body strings.Builder
	y := 30.0
	fmt.Fprintf(&body, `<text x="10" y="18" font-size="13" font-weight="bold">pgwake bench: latency per system</text>`+"\n")
	fmt.Fprintf(&body, `<text x="10" y="32" font-size="10">pgwake commit %s; %s; median of %d run(s)</text>`+"\n",
		esc(orDash(rep.Commit)), esc(orDash(rep.Server)), rep.Runs)
	y += 10
	palette := []string{"#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"}
	colour := map[string]string{}
	for i, s := range rep.Systems {
		colour[s.Name()] = palette[i%len(palette)]
	}
	for _, cm := range chartModes {
		var rows []Result
		for _, r := range rep.Results {
			if r.Mode == cm.mode && !math.IsNaN(r.P50) {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		y += 18
		fmt.Fprintf(&body, `<text x="10" y="%.0f" font-size="12" font-weight="bold">%s</text>`+"\n", y, esc(cm.title))
		y += 8
		top := y
		for _, r := range rows {
			c := colour[r.System]
			if c == "" {
				c = "#555"
			}
			cy := y + rowH/2
			fmt.Fprintf(&body, `<text x="10" y="%.1f" font-size="11" dominant-baseline="middle">%s</text>`+"\n", cy, esc(r.System))
			fmt.Fprintf(&body, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1"/>`+"\n", x(r.P99), cy, x(r.Max), cy, c)
			fmt.Fprintf(&body, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1"/>`+"\n", x(r.Max), cy-4, x(r.Max), cy+4, c)
			fmt.Fprintf(&body, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.35" stroke="%s"/>`+"\n",
				x(r.P50), cy-6, math.Max(x(r.P99)-x(r.P50), 1), 12.0, c, c)
			fmt.Fprintf(&body, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", x(r.P50), cy-7, x(r.P50), cy+7, c)
			fmt.Fprintf(&body, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1" stroke-dasharray="2,1"/>`+"\n", x(r.P90), cy-6, x(r.P90), cy+6, c)
			fmt.Fprintf(&body, `<text x="%.0f" y="%.1f" font-size="10" dominant-baseline="middle">p50 %s · p99 %s ms</text>`+"\n", right+10, cy, num(r.P50), num(r.P99))
			y += rowH
		}
		// axis
		fmt.Fprintf(&body, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#000"/>`+"\n", left, y, right, y)
		for i, l := range []string{"0.1 ms", "1 ms", "10 ms", "100 ms", "1 s", "10 s"} {
			ms := axisMin * math.Pow(10, float64(i))
			fmt.Fprintf(&body, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ccc"/>`+"\n", x(ms), top, x(ms), y)
			fmt.Fprintf(&body, `<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%s</text>`+"\n", x(ms), y+12, l)
		}
		y += 22
	}
	y += 10
	fmt.Fprintf(&body, `<text x="10" y="%.0f" font-size="10">bar: p50 (thick) to p99; dashed tick: p90; whisker: max. Log scale.</text>`+"\n", y)
	y += 10
	return fmt.Sprintf(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif">
<rect width="100%%" height="100%%" fill="#fff"/>
%s</svg>
`, width, y, width, y, body.String())
}

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}
