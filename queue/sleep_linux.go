package queue

import (
	"syscall"
	"time"
)

// sleepFor returns a channel closed once d has passed, d under a
// millisecond included. A Go timer shorter than a millisecond fires after
// about 1.1 ms in a process with nothing else to do (the runtime's
// netpoller waits in whole milliseconds; BenchmarkStreamPollSleep), which
// made a stream's poll (then 500 us) a 1.1 ms one. A nanosleep on a goroutine of
// its own (its thread blocks, the runtime runs others meanwhile) wakes
// within about 0.1 ms of d. The goroutine ends when d has passed, whether
// or not anyone still waits.
func sleepFor(d time.Duration) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		ts := syscall.NsecToTimespec(int64(d))
		for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
		}
		close(c)
	}()
	return c
}
