// Package backoff is pgwake's one exponential backoff: the delays of job
// retries (queue.DefaultBackoff), and the jittered waits of reconnects (the
// LISTEN connection, the event stream) and of claim and publish errors.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Exponential returns min * 2^(n-1) capped at max, for n >= 1 (n below 1
// counts as 1).
func Exponential(n int, min, max time.Duration) time.Duration {
	if n < 1 {
		n = 1
	}
	d := min
	for i := 1; i < n; i++ {
		if d >= max/2 {
			return max
		}
		d *= 2
	}
	return d
}

// Jitter returns a random duration between d/2 and d ("equal jitter"): many
// clients that failed together do not retry together, and none waits less
// than half its backoff.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// Backoff is a doubling wait from Min to Max, for a loop that retries
// until it succeeds. The zero value is not usable: set Min and Max.
type Backoff struct {
	Min, Max time.Duration
	n        int
}

// Next returns the next wait, jittered, and doubles the one after it.
func (b *Backoff) Next() time.Duration {
	b.n++
	return Jitter(Exponential(b.n, b.Min, b.Max))
}

// Current is the unjittered wait Next is based on now.
func (b *Backoff) Current() time.Duration { return Exponential(b.n+1, b.Min, b.Max) }

// Reset starts again from Min.
func (b *Backoff) Reset() { b.n = 0 }
