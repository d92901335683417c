package queue

import (
	"math"
	"sync/atomic"
	"time"
)

// Batching policy. Under a backlog one claim takes several due jobs and runs
// them one after another in one transaction, each behind its own savepoint,
// so a fast job costs a fraction of a round trip. Three rules keep a job's
// start time independent of the jobs it was claimed with:
//   - a batch is sized so its handlers take about BatchTarget, from the
//     moving average of handler time;
//   - a kind whose recent handler time (a decaying high-water mark) exceeds
//     slowKind, or that this process has not run yet, is claimed alone:
//     the claim statement takes such a job only as the head of a batch of
//     one (claimBatchSQL);
//   - a batch stops starting jobs once it has run for cutAfter; the jobs it
//     did not start are released with its commit and claimed again at once.

// slowKind is the handler time above which a kind is claimed alone. Below
// it, a job claimed behind one run of the kind waits at most that run (the
// batch is cut after 2 x BatchTarget); a scheduling hiccup of a few
// milliseconds does not stop a fast kind from batching.
const slowKind = 50 * time.Millisecond

// cutAfter is how long a batch may run before it releases the jobs it has
// not started.
// Saturating: 2 x a BatchTarget near math.MaxInt64 wrapped negative, which
// cut every batch after its first job (TestHugeBatchTargetStillBatches).
func (c *Client) cutAfter() time.Duration {
	if c.cfg.BatchTarget > math.MaxInt64/2 {
		return math.MaxInt64
	}
	return 2 * c.cfg.BatchTarget
}

// kindStats holds, per registered kind, a decaying high-water mark of its
// handler time in nanoseconds (0: not run yet). The map is fixed at New.
type kindStats map[string]*atomic.Int64

func newKindStats(cfg Config) kindStats {
	ks := make(kindStats, len(cfg.Handlers))
	for kind := range cfg.Handlers {
		ks[kind] = new(atomic.Int64)
	}
	return ks
}

// observe folds one handler run into kind's mark: a slower run raises it at
// once, faster runs lower it by 1/16 each.
func (ks kindStats) observe(kind string, d time.Duration) {
	v, ok := ks[kind]
	if !ok {
		return
	}
	old := v.Load()
	v.Store(max(int64(d), old-old/16, 1))
}

// alone lists the kinds that run in batches of one: not run yet, or slower
// than slowKind.
func (ks kindStats) alone() []string {
	out := []string{} // not nil: a nil slice is a NULL array in SQL
	for kind, v := range ks {
		if n := v.Load(); n == 0 || n > int64(slowKind) {
			out = append(out, kind)
		}
	}
	return out
}

// batchSize is how many jobs the next claim takes: enough fast jobs to fill
// about BatchTarget of handler time, one when handlers are slow or unknown.
func (l *queueLoop) batchSize() int {
	maxB := l.c.cfg.MaxBatch
	if maxB <= 1 {
		return 1
	}
	avg := l.avgNanos.Load()
	if avg <= 0 {
		return 1
	}
	n := int(int64(l.c.cfg.BatchTarget) / avg)
	return max(1, min(n, maxB))
}

// observe records one handler run in the loop's average and its kind's mark.
func (l *queueLoop) observe(kind string, d time.Duration) {
	l.c.kinds.observe(kind, d)
	old := l.avgNanos.Load()
	if old == 0 {
		l.avgNanos.Store(int64(d))
		return
	}
	l.avgNanos.Store(old + (int64(d)-old)/8)
}
