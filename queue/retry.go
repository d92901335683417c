package queue

import "time"

// DefaultBackoff is 30s * 2^(attempt-1), capped at 24h: 30s, 1m, 2m, 4m, ...
func DefaultBackoff(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 12 {
		return 24 * time.Hour
	}
	d := 30 * time.Second << (attempt - 1)
	return min(d, 24*time.Hour)
}

// retryDecision is what a failed attempt leads to: the job's next state and,
// when it is pending again, the delay before it is due.
type retryDecision struct {
	state string
	delay time.Duration
}

// decide applies the retry policy to a failed attempt of j: retry after
// Config.Backoff(attempt) while attempts remain, else fail for good.
func (c *Client) decide(j *Job) retryDecision {
	if j.Attempt >= j.MaxAttempts {
		return retryDecision{state: StateFailed}
	}
	return retryDecision{state: StatePending, delay: max(c.cfg.Backoff(j.Attempt), 0)}
}
