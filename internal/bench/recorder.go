package bench

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// recorder counts handler starts per job and keeps the time of each job's
// first start, as the monotonic duration since base.
type recorder struct {
	base  time.Time
	count []atomic.Int32
	start []atomic.Int64 // ns since base of the first start; 0 until then
	seen  atomic.Int64   // distinct jobs started
	extra atomic.Int64   // calls with a seq outside 0..n-1

	doneOnce sync.Once
	done     chan struct{} // closed when every job has started
	progress chan struct{} // poked on every first start
}

func newRecorder(n int, base time.Time) *recorder {
	r := &recorder{
		base:     base,
		count:    make([]atomic.Int32, n),
		start:    make([]atomic.Int64, n),
		done:     make(chan struct{}),
		progress: make(chan struct{}, 1),
	}
	if n == 0 {
		close(r.done)
	}
	return r
}

// handle is the HandleFunc given to systems.
func (r *recorder) handle(seq int64) {
	now := time.Since(r.base)
	if seq < 0 || seq >= int64(len(r.count)) {
		r.extra.Add(1)
		return
	}
	if r.count[seq].Add(1) != 1 {
		return
	}
	r.start[seq].Store(max(int64(now), 1))
	select {
	case r.progress <- struct{}{}:
	default:
	}
	if r.seen.Add(1) == int64(len(r.count)) {
		r.doneOnce.Do(func() { close(r.done) })
	}
}

// startedAt returns job seq's first start since base, and whether it started.
func (r *recorder) startedAt(seq int) (time.Duration, bool) {
	ns := r.start[seq].Load()
	return time.Duration(ns), ns != 0
}

// startSpan is the earliest and the latest first start of any job (0, 0
// if none started).
func (r *recorder) startSpan() (first, last time.Duration) {
	var lo, hi int64
	for i := range r.start {
		ns := r.start[i].Load()
		if ns == 0 {
			continue
		}
		if lo == 0 || ns < lo {
			lo = ns
		}
		hi = max(hi, ns)
	}
	return time.Duration(lo), time.Duration(hi)
}

// tally returns how many handler starts were beyond the first (duplicates,
// including calls with an unknown seq) and how many jobs never started.
func (r *recorder) tally() (duplicates, missing int64) {
	for i := range r.count {
		switch c := r.count[i].Load(); {
		case c == 0:
			missing++
		case c > 1:
			duplicates += int64(c - 1)
		}
	}
	return duplicates + r.extra.Load(), missing
}

// wait blocks until every job has started, no job has started for idle, or
// stop is closed. It reports whether every job started.
func (r *recorder) wait(idle time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(idle)
	defer t.Stop()
	for {
		select {
		case <-r.done:
			return true
		case <-stop:
			return false
		case <-r.progress:
			t.Reset(idle)
		case <-t.C:
			return false
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
