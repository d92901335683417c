package queue

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// Hooks are callbacks around enqueues and attempts (Config.Hooks). Each is
// optional; a nil hook costs one comparison. They must be safe for
// concurrent use. Package otelpgwake implements them with OpenTelemetry.
//
// For one attempt of a job the worker calls, in order: Claimed (once per
// claimed batch), Work and its done function (around the handler), then
// Complete and its done function (around the write of the outcome).
type Hooks struct {
	// BeforeEnqueue is called once per Enqueue/EnqueueMany call (and their
	// Tx twins) with the caller's context, before the jobs are checked or
	// written. It may set each job's Metadata (jobs is a copy of the
	// caller's slice; give each job a new map rather than writing into the
	// caller's). The function it returns, if not nil, is called with the
	// call's error when the call returns.
	BeforeEnqueue func(ctx context.Context, jobs []NewJob) (done func(err error))
	// Claimed is called once per claimed batch (held and leased mode, and
	// WorkOne), right after the claim statement returned its jobs, with the
	// worker's context, the jobs and the time the claim began (before a
	// connection was taken from the pool). It must not keep or modify the
	// jobs.
	Claimed func(ctx context.Context, jobs []*Job, began time.Time)
	// Work is called before each attempt's handler, with the context the
	// handler would get; the handler gets the context Work returns. The
	// function it returns, if not nil, is called with the handler's error
	// (nil: success) when the handler returns, before the outcome is
	// recorded.
	Work func(ctx context.Context, job *Job) (context.Context, func(err error))
	// Complete is called once per attempt whose handler ran, when the write
	// of its outcome begins, with the worker's context. In held mode a
	// failure's write begins right after its handler and a success's with
	// the batch's commit; both end with that commit. In leased mode the
	// write is the job's own completion (its handler's transaction, or the
	// grouped completion statement) or failure statement. The function it
	// returns, if not nil, is called once the write ended with the state it
	// recorded (StateSucceeded, StatePending for a retry or a snooze,
	// StateFailed, StateCancelled; "" when it recorded none) and its error
	// (ErrLeaseLost when a leased job was no longer this worker's).
	Complete func(ctx context.Context, job *Job) (done func(state JobState, err error))
}

// hookClaimed calls the Claimed hook, if any, for b's jobs.
func (c *Client) hookClaimed(ctx context.Context, b *batch, began time.Time) {
	h := c.cfg.Hooks.Claimed
	if h == nil {
		return
	}
	jobs := make([]*Job, len(b.jobs))
	for i := range b.jobs {
		jobs[i] = &b.jobs[i].job
	}
	// A panic is logged and the batch goes on: unrecovered, it left the
	// claim's connection and row locks behind (WorkOne) or ended the
	// process (TestHookPanicsAreContained).
	defer c.recoverHook("the Claimed hook", jobs[0].ID)
	h(ctx, jobs, began)
}

// recoverHook logs a hook's panic instead of letting it end the worker.
func (c *Client) recoverHook(what string, jobID int64) {
	if p := recover(); p != nil {
		c.log.Error(what+" panicked", zap.Int64("job_id", jobID), zap.Any("panic", p))
	}
}

// completing calls the Complete hook, if any, for r's job and keeps its
// done function in r; a panic of either is logged.
func (c *Client) completing(ctx context.Context, r *attemptResult) {
	h := c.cfg.Hooks.Complete
	if h == nil || r.completed != nil {
		return
	}
	id := r.job.ID
	var done func(JobState, error)
	func() {
		defer c.recoverHook("the Complete hook", id)
		done = h(ctx, r.job)
	}()
	if done == nil {
		return
	}
	r.completed = func(state JobState, err error) {
		defer c.recoverHook("the Complete hook's done function", id)
		done(state, err)
	}
}

// completedWith calls r's Complete done function, if any, once.
func (r *attemptResult) completedWith(err error) {
	if r.completed == nil {
		return
	}
	done := r.completed
	r.completed = nil
	var state JobState
	if err == nil {
		state = r.finalState()
	}
	done(state, err)
}

// finalState is the state r's recorded outcome left its job in ("" for
// none).
func (r *attemptResult) finalState() JobState {
	switch {
	case r.outcome == outcomeCommitError || r.outcome == outcomeLeaseLost:
		return ""
	case r.outcome == outcomeCancelled:
		return StateCancelled
	case r.outcome == outcomeSnoozed:
		return StatePending
	case r.err == nil:
		return StateSucceeded
	}
	return r.state
}
