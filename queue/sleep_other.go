//go:build !linux

package queue

import "time"

// sleepFor returns a channel closed once d has passed: a Go timer (see
// sleep_linux.go for why Linux does otherwise).
func sleepFor(d time.Duration) <-chan struct{} {
	c := make(chan struct{})
	time.AfterFunc(d, func() { close(c) })
	return c
}
