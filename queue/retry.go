package queue

import (
	"errors"
	"fmt"
	"go.uber.org/zap"
	"time"

	"github.com/pgwake/pgwake/internal/backoff"
)

// DefaultBackoff is 30s * 2^(attempt-1), capped at 24h: 30s, 1m, 2m, 4m, ...
func DefaultBackoff(attempt int) time.Duration {
	return backoff.Exponential(attempt, 30*time.Second, 24*time.Hour)
}

// RetryPolicy returns the delay before a failed attempt of j (j.Attempt is
// the attempt that failed) runs again, given the error its handler returned.
// A negative delay fails the job for good at once. It is asked only while
// attempts remain (j.Attempt < j.MaxAttempts). Set per kind in
// Config.RetryPolicies; kinds without one use Config.Backoff.
type RetryPolicy func(j *Job, err error) time.Duration

// Snooze returns an error that, returned by a handler, puts the job back to
// pending, due after d (a negative d, such as time.Until of a time past,
// counts as 0), without counting the attempt: its attempts stay as they
// were, and a "snoozed" event is appended. A handler that always snoozes
// its job by 0 runs it again and again at once: snooze by a delay. Like any error, it rolls
// back what the handler wrote through its transaction.
func Snooze(d time.Duration) error { return &outcomeError{kind: outcomeSnooze, delay: max(d, 0)} }

// Cancel returns an error that, returned by a handler, ends the job
// cancelled: the attempt counts, err (if not nil) is stored as its last
// error, and it is not retried. Like any error, it rolls back what the
// handler wrote through its transaction.
func Cancel(err error) error { return &outcomeError{kind: outcomeCancel, err: err} }

// RetryAfter returns an error that fails the attempt like err would, with
// the retry due after d instead of the retry policy's delay. On the last
// attempt the job fails for good, as with any error.
func RetryAfter(d time.Duration, err error) error {
	return &outcomeError{kind: outcomeRetryAfter, delay: max(d, 0), err: err}
}

// IsSnooze reports whether err is, or wraps, an outcome made by Snooze.
func IsSnooze(err error) bool { return outcomeKind(err) == outcomeSnooze }

// IsCancel reports whether err is, or wraps, an outcome made by Cancel.
func IsCancel(err error) bool { return outcomeKind(err) == outcomeCancel }

// outcomeKind is the kind of the outcome err carries, 0 for none.
func outcomeKind(err error) int {
	var oe *outcomeError
	if errors.As(err, &oe) {
		return oe.kind
	}
	return 0
}

// Kinds of outcomeError.
const (
	outcomeSnooze = iota + 1
	outcomeCancel
	outcomeRetryAfter
)

// outcomeError is a handler's explicit outcome (Snooze, Cancel,
// RetryAfter).
type outcomeError struct {
	kind  int
	delay time.Duration
	err   error
}

func (e *outcomeError) Error() string {
	switch e.kind {
	case outcomeSnooze:
		return fmt.Sprintf("snoozed for %s", e.delay)
	case outcomeCancel:
		if e.err == nil {
			return "cancelled by its handler"
		}
		return "cancelled by its handler: " + e.err.Error()
	default:
		if e.err == nil {
			return fmt.Sprintf("retry after %s", e.delay)
		}
		return e.err.Error()
	}
}

func (e *outcomeError) Unwrap() error { return e.err }

// retryDecision is what a failed attempt leads to: the event that records it
// (the job's next state follows from it: StateAfter) and, when it is pending
// again, the delay before it is due.
type retryDecision struct {
	event EventType
	delay time.Duration
}

// state is the state the decision leaves the job in, from the transition table.
func (d retryDecision) state() JobState {
	s, _ := StateAfter(d.event)
	return s
}

// decide applies the handler's explicit outcome (Snooze, Cancel,
// RetryAfter) or the retry policy to a failed attempt of j: retry after the
// kind's RetryPolicy (or Config.Backoff) while attempts remain, else fail
// for good.
func (c *Client) decide(j *Job, herr error) retryDecision {
	var oe *outcomeError
	if errors.As(herr, &oe) {
		switch oe.kind {
		case outcomeSnooze:
			return retryDecision{event: EventSnoozed, delay: oe.delay}
		case outcomeCancel:
			return retryDecision{event: EventCancelled}
		}
	}
	if j.Attempt >= j.MaxAttempts {
		return retryDecision{event: EventFailed}
	}
	var d time.Duration
	switch policy := c.cfg.RetryPolicies[j.Kind]; {
	case oe != nil && oe.kind == outcomeRetryAfter:
		d = oe.delay
	case policy != nil:
		var failed bool
		d, failed = c.policyDelay(policy, j, herr)
		if failed {
			return retryDecision{event: EventFailed}
		}
	default:
		d = c.backoff(j)
	}
	return retryDecision{event: EventRetryScheduled, delay: d}
}

// policyDelay is policy's delay for j's failed attempt (failed: it said to
// fail for good). A policy that panics is logged and DefaultBackoff used:
// it runs on the worker's goroutine, where a panic would end the process
// (TestHandlerErrorsThatPanic).
func (c *Client) policyDelay(policy RetryPolicy, j *Job, herr error) (d time.Duration, failed bool) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("the kind's RetryPolicy panicked; DefaultBackoff used", zap.Int64("job_id", j.ID), zap.String("kind", j.Kind), zap.Any("panic", r))
			d, failed = DefaultBackoff(j.Attempt), false
		}
	}()
	handed := *j // the policy's copy
	d = policy(&handed, herr)
	return d, d < 0
}

// backoff is Config.Backoff's delay for j's retry, never negative; a
// Backoff that panics is logged and DefaultBackoff used.
func (c *Client) backoff(j *Job) (d time.Duration) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("Config.Backoff panicked; DefaultBackoff used", zap.Int("attempt", j.Attempt), zap.Any("panic", r))
			d = DefaultBackoff(j.Attempt)
		}
	}()
	return max(c.cfg.Backoff(j.Attempt), 0)
}
