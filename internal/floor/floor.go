// Package floor checks configured durations against their floors: a
// duration of a nanosecond where seconds are meant ran a loop without
// pause (notify's ping, the event stream's lag query).
package floor

import (
	"fmt"
	"time"
)

// D is a configured duration, its name and its floor.
type D struct {
	Name       string
	Value, Min time.Duration
}

// Check returns an error naming the first of ds that is set (above zero:
// zero takes the caller's default) and below its floor; nil if none is.
func Check(ds ...D) error {
	for _, d := range ds {
		if d.Value > 0 && d.Value < d.Min {
			return fmt.Errorf("%s %s is below %s", d.Name, d.Value, d.Min)
		}
	}
	return nil
}
