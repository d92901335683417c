package queue

import "context"

// Hooks are callbacks around enqueues and attempts (Config.Hooks). Each is
// optional; a nil hook costs one comparison. They must be safe for
// concurrent use. Package otelpgwake implements them with OpenTelemetry.
type Hooks struct {
	// BeforeEnqueue is called once per Enqueue/EnqueueMany call (and their
	// Tx twins) with the caller's context, before the jobs are checked or
	// written. It may set each job's Metadata (jobs is a copy of the
	// caller's slice; give each job a new map rather than writing into the
	// caller's). The function it returns, if not nil, is called with the
	// call's error when the call returns.
	BeforeEnqueue func(ctx context.Context, jobs []NewJob) (done func(err error))
	// Work is called before each attempt's handler, with the context the
	// handler would get; the handler gets the context Work returns. The
	// function it returns, if not nil, is called with the handler's error
	// (nil: success) when the handler returns, before the outcome is
	// recorded.
	Work func(ctx context.Context, job *Job) (context.Context, func(err error))
}
