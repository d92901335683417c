package queue

import (
	"testing"
	"time"
)

// feed adds one job every gap for d, starting at t0, and returns whether
// the window called it a stream at the end and the time reached.
func feed(w *rateWindow, t0 time.Time, gap, d time.Duration) (bool, time.Time) {
	fast := false
	t := t0
	for ; t.Sub(t0) < d; t = t.Add(gap) {
		fast = w.add(1, t)
	}
	return fast, t
}

func TestRateWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		gap  time.Duration
		want bool
	}{
		{"200 jobs/s is not a stream", 5 * time.Millisecond, false},
		{"400 jobs/s is not a stream", 2500 * time.Microsecond, false},
		{"1000 jobs/s is a stream", time.Millisecond, true},
		{"5000 jobs/s is a stream", 200 * time.Microsecond, true},
	}
	for _, c := range cases {
		var w rateWindow
		if got, _ := feed(&w, t0, c.gap, time.Second); got != c.want {
			t.Errorf("%s: got %v", c.name, got)
		}
	}

	// A stream that slows down ends within two windows of the change.
	var w rateWindow
	fast, t1 := feed(&w, t0, time.Millisecond, time.Second)
	if !fast {
		t.Fatal("1000 jobs/s: not a stream")
	}
	if fast, _ = feed(&w, t1, 10*time.Millisecond, 2*streamWindow+10*time.Millisecond); fast {
		t.Error("100 jobs/s after a stream: still a stream after two windows")
	}

	// Looks that find nothing end a stream too: a window with no job.
	w = rateWindow{}
	_, t1 = feed(&w, t0, time.Millisecond, time.Second)
	if w.add(0, t1.Add(streamWindow/2)) != true {
		t.Error("half a window of silence ended the stream early")
	}
	if w.add(0, t1.Add(2*streamWindow)) {
		t.Error("two windows of silence: still a stream")
	}
}
