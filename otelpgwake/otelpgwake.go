package otelpgwake

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgwake/pgwake/queue"
)

// TracerName is the instrumentation scope of the spans.
const TracerName = "github.com/pgwake/pgwake/otelpgwake"

// Span names.
const (
	SpanEnqueue  = "pgwake.enqueue"  // producer: one Enqueue/EnqueueMany call
	SpanClaim    = "pgwake.claim"    // client: the claim statement, one span per claimed job
	SpanWork     = "pgwake.work"     // consumer: one attempt's handler
	SpanComplete = "pgwake.complete" // client: the write of one attempt's outcome
)

// Attribute keys set on the spans.
const (
	AttrJobID   = attribute.Key("pgwake.job.id")
	AttrKind    = attribute.Key("pgwake.job.kind")
	AttrQueue   = attribute.Key("pgwake.job.queue")
	AttrAttempt = attribute.Key("pgwake.job.attempt")
	AttrJobs    = attribute.Key("pgwake.enqueue.jobs")
	AttrClaimed = attribute.Key("pgwake.claim.jobs")  // jobs in the claimed batch
	AttrState   = attribute.Key("pgwake.job.state")   // the state the completion recorded
	AttrSnoozed = attribute.Key("pgwake.job.snoozed") // true on a work span whose handler snoozed the job
)

// Config says where spans go and how their context travels with a job.
type Config struct {
	// TracerProvider makes the spans. Default otel.GetTracerProvider() at
	// the time Hooks is called.
	TracerProvider trace.TracerProvider
	// Propagator writes the enqueue span's context into each job's
	// metadata and reads it back in the worker. Default W3C trace context
	// and baggage (propagation.TraceContext, propagation.Baggage), so
	// producer and worker agree whatever their global propagator is.
	Propagator propagation.TextMapPropagator
}

// Hooks returns queue.Hooks that trace enqueues and, for each attempt, its
// claim, its handler and the write of its outcome.
func Hooks(cfg Config) queue.Hooks {
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	t := &tracer{tr: cfg.TracerProvider.Tracer(TracerName), prop: cfg.Propagator}
	return queue.Hooks{BeforeEnqueue: t.enqueue, Claimed: t.claimed, Work: t.work, Complete: t.complete}
}

type tracer struct {
	tr   trace.Tracer
	prop propagation.TextMapPropagator
}

var system = attribute.String("messaging.system", "pgwake")

// enqueue starts the producer span and stores its context in every job.
func (t *tracer) enqueue(ctx context.Context, jobs []queue.NewJob) func(error) {
	ctx, span := t.tr.Start(ctx, SpanEnqueue, producer)
	if !span.SpanContext().IsValid() {
		return nil // a no-op provider: nothing to store, nothing to end
	}
	if span.IsRecording() {
		span.SetAttributes(system, AttrJobs.Int(len(jobs)))
		if len(jobs) == 1 {
			span.SetAttributes(AttrKind.String(jobs[0].Kind), AttrQueue.String(queueOf(jobs[0])))
		}
	}
	for i := range jobs {
		carrier := propagation.MapCarrier{}
		for k, v := range jobs[i].Metadata {
			carrier[k] = v
		}
		t.prop.Inject(ctx, carrier)
		jobs[i].Metadata = carrier
	}
	return func(err error) { end(span, err) }
}

// parent is ctx with the enqueue span stored with job j as its span (a
// remote parent), and that span's context, if the job has one.
func (t *tracer) parent(ctx context.Context, j *queue.Job) (context.Context, trace.SpanContext) {
	if len(j.Metadata) == 0 {
		return ctx, trace.SpanContext{}
	}
	before := trace.SpanContextFromContext(ctx)
	ctx = t.prop.Extract(ctx, propagation.MapCarrier(j.Metadata))
	if sc := trace.SpanContextFromContext(ctx); !sc.Equal(before) {
		return ctx, sc
	}
	return ctx, trace.SpanContext{} // metadata without a trace context
}

// start starts a span named name about job j, a child of its enqueue span
// and linked to it: OpenTelemetry's messaging conventions ask consumer-side
// spans for a link to the message's creation context (the parent is
// optional there, and the link is what tools that follow them look for).
func (t *tracer) start(ctx context.Context, name string, j *queue.Job, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx, enq := t.parent(ctx, j)
	if enq.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: enq}))
	}
	ctx, span := t.tr.Start(ctx, name, opts...)
	if span.IsRecording() {
		span.SetAttributes(system, AttrJobID.Int64(j.ID), AttrKind.String(j.Kind), AttrQueue.String(j.Queue), AttrAttempt.Int(j.Attempt))
	}
	return ctx, span
}

// claimed records one claim span per job of a claimed batch, from the
// claim's start to now, each a child of its job's enqueue span.
func (t *tracer) claimed(ctx context.Context, jobs []*queue.Job, began time.Time) {
	for _, j := range jobs {
		_, span := t.start(ctx, SpanClaim, j, client, trace.WithTimestamp(began))
		if span.IsRecording() {
			span.SetAttributes(AttrClaimed.Int(len(jobs)))
		}
		span.End()
	}
}

// work starts the consumer span, a child of the enqueue span stored with
// the job. A snooze (queue.Snooze) is not a failure: it ends the span with
// AttrSnoozed and no error status.
func (t *tracer) work(ctx context.Context, j *queue.Job) (context.Context, func(error)) {
	ctx, span := t.start(ctx, SpanWork, j, consumer)
	if !span.IsRecording() {
		return ctx, nil // ending it would do nothing
	}
	return ctx, func(err error) {
		if err != nil && queue.IsSnooze(err) {
			span.SetAttributes(AttrSnoozed.Bool(true))
			err = nil
		}
		end(span, err)
	}
}

// complete starts the span of an outcome's write, a child of the job's
// enqueue span (a sibling of its work span).
func (t *tracer) complete(ctx context.Context, j *queue.Job) func(queue.JobState, error) {
	_, span := t.start(ctx, SpanComplete, j, client)
	if !span.IsRecording() {
		return nil
	}
	return func(state queue.JobState, err error) {
		if state != "" {
			span.SetAttributes(AttrState.String(string(state)))
		}
		end(span, err)
	}
}

// The span kinds, as start options made once.
var (
	producer = trace.WithSpanKind(trace.SpanKindProducer)
	consumer = trace.WithSpanKind(trace.SpanKindConsumer)
	client   = trace.WithSpanKind(trace.SpanKindClient)
)

func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func queueOf(j queue.NewJob) string {
	if j.Queue == "" {
		return queue.DefaultQueue
	}
	return j.Queue
}
