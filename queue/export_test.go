package queue

import (
	"testing"
	"time"
)

// SetWarmPoolTimeout bounds c's warm-up at Start by d instead of
// warmPoolTimeout: a test of what the warm-up readies does not depend on
// how loaded the machine is. Call it before Run or Start.
func SetWarmPoolTimeout(c *Client, d time.Duration) { c.warmTimeout = d }

// SetRecordTimeout bounds c's statements that record outcomes by d
// instead of recordTimeout. Call it before Run or Start.
func SetRecordTimeout(c *Client, d time.Duration) { c.recordTimeout = d }

// SetHandOff bounds c's wait for a wake-up's job to start (handOff) by d.
// Call it before Run or Start.
func SetHandOff(c *Client, d time.Duration) { c.handOff = d }

// Starting reports whether a Start of c has begun (a Stop from now on
// waits for it and stops what it started) and no Stop has taken it yet.
func Starting(c *Client) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started != nil
}

// Signals are a client's test signals (testsignal.go), for the tests of
// queue_test.
type Signals struct {
	s *testSignals
	c *Client
}

// EnableTestSignals turns c's test signals on. Call it before Run or Start.
func EnableTestSignals(c *Client) Signals {
	c.signals = newTestSignals()
	return Signals{c.signals, c}
}

// WaitAsleep waits until queue's dispatcher blocks waiting for work,
// idle-marked and past the idle barrier and the look after it, having
// claimed at least claimed jobs since it started.
func (s Signals) WaitAsleep(t testing.TB, queue string, claimed int) {
	t.Helper()
	waitSignal(t, s.s.asleep, "dispatcher of "+queue+" asleep", func(a asleepSignal) bool {
		return a.queue == queue && a.claimed >= claimed
	})
}

// WaitArmed waits until queue's dispatcher sleeps with its timer armed for
// a delayed job at a time match accepts, and returns that time.
func (s Signals) WaitArmed(t testing.TB, queue string, match func(at time.Time) bool) time.Time {
	t.Helper()
	var got time.Time
	waitSignal(t, s.s.armed, "timer of "+queue+" armed", func(a armedSignal) bool {
		got = a.at
		return a.queue == queue && match(a.at)
	})
	return got
}

// LookAgain makes queue's dispatcher look for due jobs now, as its poll
// would, waits until it is asleep again after a look that began after the
// call, and returns how many jobs it had claimed since it started.
func (s Signals) LookAgain(t testing.TB, queue string) (claimed int) {
	t.Helper()
	// Counted and asked together: the first wake-up taken after this takes
	// this one and records seq.
	l := s.c.loops[queue]
	l.mu.Lock()
	seq := s.s.looksAsked.Add(1)
	if l.now == "" {
		l.now = sourcePoll
	}
	l.mu.Unlock()
	select {
	case l.signal <- struct{}{}:
	default:
	}
	waitSignal(t, s.s.asleep, "dispatcher of "+queue+" asleep after a look", func(a asleepSignal) bool {
		if a.queue != queue || a.lookSeq < seq {
			return false
		}
		claimed = a.claimed
		return true
	})
	return claimed
}

// ForgetPausedLooks forgets the paused looks signalled so far: the next
// WaitPausedLooks counts only those that follow.
func (s Signals) ForgetPausedLooks() { s.s.pausedLook.clear() }

// WaitListening waits until the client's listener LISTENs on its channel
// (a notification sent from now on reaches the client) and the client has
// woken its dispatchers to look again (LookAgain waits for that look).
func (s Signals) WaitListening(t testing.TB) {
	t.Helper()
	waitSignal(t, s.s.listening, "listening", func(struct{}) bool { return true })
}

// WaitDraining waits until Run (or Stop) stopped every dispatcher and waits
// for running handlers: nothing more is claimed.
func (s Signals) WaitDraining(t testing.TB) {
	t.Helper()
	waitSignal(t, s.s.draining, "draining", func(struct{}) bool { return true })
}

// WaitPausedLooks waits until queue's dispatcher found its queue paused n
// times (once when it met the pause, then after each poll or wake-up).
func (s Signals) WaitPausedLooks(t testing.TB, queue string, n int) {
	t.Helper()
	seen := 0
	waitSignal(t, s.s.pausedLook, "paused looks at "+queue, func(q string) bool {
		if q == queue {
			seen++
		}
		return seen >= n
	})
}

// StartRecorded waits until the attempt record of job id is committed;
// false if that took longer than d. For handlers, which may not stop the
// test.
func (s Signals) StartRecorded(id int64, d time.Duration) bool {
	return readSignal(s.s.startsRecorded, d, func(ids []int64) bool {
		for _, x := range ids {
			if x == id {
				return true
			}
		}
		return false
	})
}

// BeforeLease sets f to run (it may block) before a leased job's lease is
// registered in the client. Call it before Run or Start.
func (s Signals) BeforeLease(f func(id int64)) { s.s.beforeLease = f }

// HandlerStarts sets f to run as a job's handler is about to start, before
// a dispatcher waiting for that start (handOff) is told. Call it before Run
// or Start.
func (s Signals) HandlerStarts(f func(id int64)) { s.s.handlerStarts = f }

// WaitCancelKept waits until a cancel of leased job id, not running in the
// client, was kept for it.
func (s Signals) WaitCancelKept(t testing.TB, id int64) {
	t.Helper()
	waitSignal(t, s.s.cancelKept, "cancel kept", func(x int64) bool { return x == id })
}

// testSignalTimeout bounds a wait for a signal: long, only a hung runtime
// reaches it.
const testSignalTimeout = 30 * time.Second

// waitSignal reads sig until match returns true, failing t after
// testSignalTimeout.
func waitSignal[T any](t testing.TB, sig testSignal[T], what string, match func(T) bool) {
	t.Helper()
	if !readSignal(sig, testSignalTimeout, match) {
		t.Fatalf("no test signal within %s: %s", testSignalTimeout, what)
	}
}

// readSignal reads sig until match returns true (true) or d passed (false).
func readSignal[T any](sig testSignal[T], d time.Duration, match func(T) bool) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		select {
		case v := <-sig.ch:
			if match(v) {
				return true
			}
		case <-deadline.C:
			return false
		}
	}
}

// SetCompletionLinger sets how long c's first leased success waits for
// others before they are written together (completionLinger by default).
// Call it before Run or Start.
func SetCompletionLinger(c *Client, d time.Duration) { c.completions.linger = d }

// Cooldowns returns the free slots of each wait of a leased claim for more
// free slots signalled since the last call (or since EnableTestSignals).
func (s Signals) Cooldowns() []int {
	var free []int
	for {
		select {
		case n := <-s.s.cooldown.ch:
			free = append(free, n)
		default:
			return free
		}
	}
}

// Cork is cork (cork_linux.go), for TestCorkedWriteSurvivesItsProcess.
var Cork = cork
