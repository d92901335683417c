// Package otelpgwake traces pgwake jobs with OpenTelemetry: a producer span
// around each enqueue call, whose context is stored with every job it
// enqueues (in the job's metadata, as W3C trace context), and for each
// attempt a claim span (the claim statement), a consumer span around its
// handler and a completion span (the write of its outcome), all children
// of the enqueue span and linked to it, so one trace runs from the request that enqueued a
// job to the handler that ran it and the write of its outcome, across
// processes and restarts.
//
//	client, err := queue.New(pool, queue.Config{
//		Hooks: otelpgwake.Hooks(otelpgwake.Config{}), // the global TracerProvider
//		...
//	})
//
// The queue package does not import OpenTelemetry; this package plugs into
// its Config.Hooks. With no TracerProvider configured (OpenTelemetry's
// default no-op one) no span records and no metadata is written. See
// docs/tracing.md.
package otelpgwake
