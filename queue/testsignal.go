package queue

import (
	"sync/atomic"
	"time"
)

// Test signals (River's rivershared/testsignal): points of the runtime a
// test waits on instead of sleeping. A Client has none (signals is nil)
// unless a test of this package enabled them (export_test.go), so each
// point costs a nil check.

// testSignalBuffer is how many signals a channel holds before it drops new
// ones (a test that waits reads them as they come).
const testSignalBuffer = 1024

// testSignal is one point a test can wait on, carrying a T.
type testSignal[T any] struct{ ch chan T }

func (s *testSignal[T]) init() { s.ch = make(chan T, testSignalBuffer) }

// signal sends v to a waiting test; it never blocks.
func (s *testSignal[T]) signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
	}
}

// clear drops the signals sent and not read yet.
func (s *testSignal[T]) clear() {
	for {
		select {
		case <-s.ch:
		default:
			return
		}
	}
}

// asleepSignal is what a dispatcher signals when it blocks waiting for work.
type asleepSignal struct {
	queue string
	// claimed counts the jobs the dispatcher claimed since it started.
	claimed int
	// lookSeq is the dispatcher's lookSeq: looksAsked when its last look
	// began.
	lookSeq int64
}

// armedSignal is what a dispatcher signals when it arms its timer for the
// earliest delayed job it knows of.
type armedSignal struct {
	queue string
	at    time.Time // when the timer fires
}

// testSignals are a client's test signals.
type testSignals struct {
	// asleep: a dispatcher blocks waiting for work, idle-marked, past the
	// idle barrier and the look after it: only a wake-up, a delayed job
	// or the poll ends the wait (waitForWork).
	asleep testSignal[asleepSignal]
	// armed: a dispatcher sleeps with its timer armed for the earliest
	// delayed job it knows of (waitForWork).
	armed testSignal[armedSignal]
	// pausedLook: a dispatcher found its queue paused and waits for a
	// resume or the poll (waitWhilePaused). Carries the queue.
	pausedLook testSignal[string]
	// startsRecorded: the attempt records of a batch are committed
	// (sendStarts). Carries the jobs' ids.
	startsRecorded testSignal[[]int64]
	// cancelKept: a cancel of a leased job not running here was kept
	// (earlyCancels). Carries the job's id.
	cancelKept testSignal[int64]
	// cooldown: a leased claim under a backlog waits for more free slots
	// (awaitFreeSlots). Carries the free slots, the claim's included.
	cooldown testSignal[int]
	// listening: the listener (re)connected and LISTENs on the client's
	// channel: its Resync reached the client, which woke its dispatchers
	// (onNotify).
	listening testSignal[struct{}]
	// draining: Run's (or Stop's) dispatchers have all returned, and it
	// waits for running handlers (serve).
	draining testSignal[struct{}]
	// looksAsked counts the looks tests asked for (each with a wake-up,
	// under the loop's mu): a dispatcher asleep with a lookSeq of n has
	// looked since the n-th was asked.
	looksAsked atomic.Int64
	// beforeLease, when set, runs (and may block) before a leased job's
	// lease is registered in the client.
	beforeLease func(id int64)
	// handlerStarts, when set, runs as a job's handler is about to start,
	// before the dispatcher waiting for that start (handOff) is told.
	handlerStarts func(id int64)
}

// handlerStarting runs the handlerStarts hook, if any.
func (s *testSignals) handlerStarting(id int64) {
	if s != nil && s.handlerStarts != nil {
		s.handlerStarts(id)
	}
}

func newTestSignals() *testSignals {
	s := &testSignals{}
	s.asleep.init()
	s.armed.init()
	s.pausedLook.init()
	s.startsRecorded.init()
	s.cancelKept.init()
	s.cooldown.init()
	s.listening.init()
	s.draining.init()
	return s
}
