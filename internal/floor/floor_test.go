package floor

import (
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	ok := []D{{"A", 0, time.Second}, {"B", time.Second, time.Second}, {"C", -1, time.Second}}
	if err := Check(ok...); err != nil {
		t.Fatalf("unset, at the floor and negative (refused elsewhere) pass: %v", err)
	}
	err := Check(append(ok, D{"D", time.Nanosecond, time.Millisecond}, D{"E", 1, time.Second})...)
	if err == nil || err.Error() != "D 1ns is below 1ms" {
		t.Fatalf("got %v, want the first duration below its floor", err)
	}
}
