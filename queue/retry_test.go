package queue

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDecide is the retry-or-fail decision alone, without a database: the
// outcome controls, the per-kind policy, Config.Backoff and the last attempt.
func TestDecide(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	c := &Client{cfg: Config{
		Backoff: func(attempt int) time.Duration { return time.Duration(attempt) * time.Second },
		RetryPolicies: map[string]RetryPolicy{
			"partner": func(j *Job, err error) time.Duration {
				if errors.Is(err, errPermanent) {
					return -1 // fail for good
				}
				return 42 * time.Millisecond
			},
		},
	}}
	job := func(kind string, attempt, maxAttempts int) *Job {
		return &Job{Kind: kind, Attempt: attempt, MaxAttempts: maxAttempts}
	}
	retry := func(d time.Duration) retryDecision {
		return retryDecision{event: EventRetryScheduled, delay: d}
	}
	failed := retryDecision{event: EventFailed}
	for _, tc := range []struct {
		name string
		job  *Job
		err  error
		want retryDecision
	}{
		{"backoff while attempts remain", job("email", 2, 5), boom, retry(2 * time.Second)},
		{"last attempt fails for good", job("email", 5, 5), boom, failed},
		{"negative backoff counts as none", job("neg", 1, 5), boom, retry(0)},
		{"kind policy replaces Backoff", job("partner", 1, 5), boom, retry(42 * time.Millisecond)},
		{"kind policy fails for good", job("partner", 1, 5), fmt.Errorf("wrapped: %w", errPermanent), failed},
		{"kind policy does not outlive the last attempt", job("partner", 5, 5), boom, failed},
		{"RetryAfter wins over the policy", job("partner", 1, 5), RetryAfter(7*time.Second, boom), retry(7 * time.Second)},
		{"RetryAfter on the last attempt fails", job("email", 5, 5), RetryAfter(time.Second, boom), failed},
		{"Snooze is pending again, even on the last attempt", job("email", 5, 5), Snooze(3 * time.Second),
			retryDecision{event: EventSnoozed, delay: 3 * time.Second}},
		{"negative Snooze is now", job("email", 1, 5), Snooze(-time.Second),
			retryDecision{event: EventSnoozed}},
		{"Cancel is final with attempts left", job("email", 1, 5), Cancel(boom),
			retryDecision{event: EventCancelled}},
		{"a wrapped outcome still counts", job("email", 1, 5), fmt.Errorf("handler: %w", Cancel(boom)),
			retryDecision{event: EventCancelled}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.job.Kind == "neg" {
				c := &Client{cfg: Config{Backoff: func(int) time.Duration { return -time.Second }}}
				require.Equal(t, tc.want, c.decide(tc.job, tc.err))
				return
			}
			got := c.decide(tc.job, tc.err)
			require.Equal(t, tc.want, got)
			if tc.want.event == EventFailed || tc.want.event == EventCancelled {
				require.NotEqual(t, StatePending, got.state())
			} else {
				require.Equal(t, StatePending, got.state())
			}
		})
	}
}

var errPermanent = errors.New("permanent")
