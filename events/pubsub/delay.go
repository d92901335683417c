package pubsub

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
)

// runAfter returns when msg is due, from Watermill's delay metadata
// (delay.Message, delay.WithContext with delay.NewPublisher): the zero time
// when it has none. delay.Message writes the due time in whole seconds
// (RFC 3339) and the delay as a duration; when now plus that duration falls
// in the second the due time names, it is the due time (to the
// microsecond), otherwise the written due time is. A message with only the
// duration is due that long after now. Unparsable values are refused.
func runAfter(msg *message.Message, now time.Time) (time.Time, error) {
	untilS := msg.Metadata.Get(delay.DelayedUntilKey)
	forS := msg.Metadata.Get(delay.DelayedForKey)
	if untilS == "" && forS == "" {
		return time.Time{}, nil
	}
	var d time.Duration
	haveFor := false
	if forS != "" {
		var err error
		if d, err = time.ParseDuration(forS); err != nil {
			return time.Time{}, fmt.Errorf("%w: metadata %s %.40q is not a duration", ErrInvalidMessage, delay.DelayedForKey, forS)
		}
		haveFor = true
	}
	if untilS == "" {
		return now.Add(d), nil
	}
	until, err := time.Parse(time.RFC3339Nano, untilS)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: metadata %s %.40q is not an RFC 3339 time", ErrInvalidMessage, delay.DelayedUntilKey, untilS)
	}
	if haveFor {
		if precise := now.Add(d); !precise.Before(until) && precise.Before(until.Add(time.Second)) {
			return precise, nil
		}
	}
	return until, nil
}
