package backoff

import (
	"testing"
	"time"
)

func TestExponential(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{-1, time.Second}, {0, time.Second}, {1, time.Second}, {2, 2 * time.Second}, {4, 8 * time.Second},
		{5, 10 * time.Second}, {1000, 10 * time.Second}} {
		if got := Exponential(tc.n, time.Second, 10*time.Second); got != tc.want {
			t.Errorf("Exponential(%d) = %s, want %s", tc.n, got, tc.want)
		}
	}
}

func TestJitterStaysBetweenHalfAndWhole(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := Jitter(100 * time.Millisecond)
		if d < 50*time.Millisecond || d > 100*time.Millisecond {
			t.Fatalf("Jitter(100ms) = %s", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct values in 1000: not random", len(seen))
	}
	if Jitter(0) != 0 || Jitter(-time.Second) != 0 {
		t.Fatal("Jitter of a non-positive duration is not 0")
	}
}

func TestBackoffDoublesAndResets(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	for i, max := range []time.Duration{10, 20, 40, 80, 80} {
		max *= time.Millisecond
		if d := b.Next(); d < max/2 || d > max {
			t.Fatalf("wait %d = %s, want in [%s, %s]", i, d, max/2, max)
		}
	}
	b.Reset()
	if c := b.Current(); c != 10*time.Millisecond {
		t.Fatalf("after Reset, Current = %s", c)
	}
}
