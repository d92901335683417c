package otelpgwake_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pgwake/pgwake/otelpgwake"
	"github.com/pgwake/pgwake/pgwaketest"
	"github.com/pgwake/pgwake/queue"
)

func TestMain(m *testing.M) { pgwaketest.Main(m) }

func byName(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// One trace from an HTTP-style parent span through the enqueue to the
// handler, in held and in leased mode: each attempt's claim, work and
// completion spans are children of the enqueue span (a remote parent), which
// is a child of the request's; the handler's context carries the work span;
// a failed attempt's work span records the error and its completion span
// the retry; the second attempt's completion records the success (in leased
// mode, through the handler's own transaction).
func TestTraceFromRequestToHandler(t *testing.T) {
	t.Parallel()
	for _, leased := range []bool{false, true} {
		name := map[bool]string{false: "held", true: "leased"}[leased]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			traceOneJob(t, leased)
		})
	}
}

func traceOneJob(t *testing.T, leased bool) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var inHandler []trace.SpanContext
	cfg := queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {}},
		Hooks:  otelpgwake.Hooks(otelpgwake.Config{TracerProvider: tp}),
		Handlers: map[string]queue.Handler{
			"mail": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				inHandler = append(inHandler, trace.SpanContextFromContext(ctx))
				if j.Attempt == 1 {
					return errors.New("smtp down")
				}
				_, err := tx.Exec(ctx, "SELECT 1") // leased: the completion commits this transaction
				return err
			}),
		},
	}
	if leased {
		cfg.LeasedKinds = []string{"mail"}
	}
	c := pgwaketest.NewClient(t, pgwaketest.Pool(t), cfg)

	ctx, req := tp.Tracer("http").Start(context.Background(), "POST /signup", trace.WithSpanKind(trace.SpanKindServer))
	res, err := c.Enqueue(ctx, queue.NewJob{Kind: "mail", Payload: map[string]string{"to": "ann@example.com"}, Metadata: map[string]string{"tenant": "7"}})
	require.NoError(t, err)
	req.End()

	// The first attempt fails (retry after the backoff); run the retry now.
	id, ok := pgwaketest.WorkOne(t, c)
	require.True(t, ok)
	require.Equal(t, res.ID, id)
	_, err = c.Pool().Exec(context.Background(), `UPDATE `+c.Schema()+`.jobs SET run_after = now() WHERE id = $1`, id)
	require.NoError(t, err)
	_, ok = pgwaketest.WorkOne(t, c)
	require.True(t, ok)
	pgwaketest.RequireState(t, c, id, queue.StateSucceeded)

	spans := sr.Ended()
	enq := byName(spans, otelpgwake.SpanEnqueue)
	require.Len(t, enq, 1)
	require.Equal(t, req.SpanContext().SpanID(), enq[0].Parent().SpanID(), "enqueue is a child of the request")
	require.Equal(t, trace.SpanKindProducer, enq[0].SpanKind())
	claims := byName(spans, otelpgwake.SpanClaim)
	work := byName(spans, otelpgwake.SpanWork)
	completes := byName(spans, otelpgwake.SpanComplete)
	require.Len(t, claims, 2, "one claim span per claimed job")
	require.Len(t, work, 2, "one work span per attempt")
	require.Len(t, completes, 2, "one completion span per attempt")
	for i := range work {
		for _, s := range []sdktrace.ReadOnlySpan{claims[i], work[i], completes[i]} {
			require.Equal(t, enq[0].SpanContext().TraceID(), s.SpanContext().TraceID(), "one trace: %s", s.Name())
			require.Equal(t, enq[0].SpanContext().SpanID(), s.Parent().SpanID(), "%s is a child of the enqueue span", s.Name())
			require.True(t, s.Parent().IsRemote(), s.Name())
			require.Contains(t, s.Attributes(), otelpgwake.AttrJobID.Int64(id), s.Name())
			require.Contains(t, s.Attributes(), otelpgwake.AttrAttempt.Int(i+1), s.Name())
			require.Contains(t, s.Attributes(), otelpgwake.AttrQueue.String("default"), s.Name())
		}
		require.Equal(t, trace.SpanKindClient, claims[i].SpanKind())
		require.Equal(t, trace.SpanKindConsumer, work[i].SpanKind())
		require.Equal(t, trace.SpanKindClient, completes[i].SpanKind())
		require.Contains(t, claims[i].Attributes(), otelpgwake.AttrClaimed.Int(1))
		require.Equal(t, work[i].SpanContext(), inHandler[i], "the handler's context carries the worker span")
		// claim, then work, then the write of the outcome.
		require.False(t, claims[i].EndTime().After(work[i].StartTime()), "the claim ends before the handler starts")
		require.False(t, completes[i].StartTime().Before(work[i].EndTime()), "the completion starts after the handler")
		require.Equal(t, codes.Unset, completes[i].Status().Code)
	}
	require.Equal(t, codes.Error, work[0].Status().Code)
	require.Equal(t, "smtp down", work[0].Status().Description)
	require.Equal(t, codes.Unset, work[1].Status().Code)
	require.Contains(t, completes[0].Attributes(), otelpgwake.AttrState.String(string(queue.StatePending)), "the failure's write scheduled a retry")
	require.Contains(t, completes[1].Attributes(), otelpgwake.AttrState.String(string(queue.StateSucceeded)))

	// The job's own metadata is kept beside the trace context.
	var tenant string
	require.NoError(t, c.Pool().QueryRow(context.Background(), `SELECT metadata->>'tenant' FROM `+c.Schema()+`.jobs WHERE id = $1`, id).Scan(&tenant))
	require.Equal(t, "7", tenant)
}

// Without a recording TracerProvider nothing is written with the job.
func TestNoProviderWritesNothing(t *testing.T) {
	t.Parallel()
	c := pgwaketest.NewClient(t, pgwaketest.Pool(t), queue.Config{
		Hooks: otelpgwake.Hooks(otelpgwake.Config{TracerProvider: noop.NewTracerProvider()}),
	})
	res, err := c.EnqueueMany(context.Background(), []queue.NewJob{{Kind: "a"}, {Kind: "b"}})
	require.NoError(t, err)
	var n int
	require.NoError(t, c.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+c.Schema()+`.jobs WHERE metadata IS NULL AND id = ANY($1)`,
		[]int64{res[0].ID, res[1].ID}).Scan(&n))
	require.Equal(t, 2, n)
}

// A no-op provider records nothing, but a span context already in the
// caller's context (one extracted from an incoming request, say) is what
// its Start returns, so that context is written with the job as it is.
func TestNoProviderPassesTheCallersContextOn(t *testing.T) {
	t.Parallel()
	c := pgwaketest.NewClient(t, pgwaketest.Pool(t), queue.Config{
		Hooks: otelpgwake.Hooks(otelpgwake.Config{TracerProvider: noop.NewTracerProvider()}),
	})
	tid, err := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex("b7ad6b7169203331")
	require.NoError(t, err)
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}))
	res, err := c.Enqueue(ctx, queue.NewJob{Kind: "a"})
	require.NoError(t, err)
	j, err := c.JobGet(context.Background(), res.ID)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, j.Metadata)
}
