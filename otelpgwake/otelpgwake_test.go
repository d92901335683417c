package otelpgwake_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

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
			require.Len(t, s.Links(), 1, "%s links to the enqueue span", s.Name())
			require.Equal(t, enq[0].SpanContext().TraceID(), s.Links()[0].SpanContext.TraceID(), s.Name())
			require.Equal(t, enq[0].SpanContext().SpanID(), s.Links()[0].SpanContext.SpanID(), s.Name())
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

// spanOf is the one span named name about job id.
func spanOf(t *testing.T, spans []sdktrace.ReadOnlySpan, name string, id int64) sdktrace.ReadOnlySpan {
	t.Helper()
	var out []sdktrace.ReadOnlySpan
	for _, s := range byName(spans, name) {
		if slices.Contains(s.Attributes(), otelpgwake.AttrJobID.Int64(id)) {
			out = append(out, s)
		}
	}
	require.Len(t, out, 1, "%s spans of job %d", name, id)
	return out[0]
}

// The completion span records each outcome, in held and in leased mode: a
// job failed for good (pgwake.job.state=failed) and a cancelled one
// (cancelled), each with the error on its work span and an unset status on
// its completion span, since the write succeeded; a snoozed one (pending),
// with no error on either span and pgwake.job.snoozed on its work span; a write that fails (held:
// the batch's COMMIT, through a deferred constraint the handler broke;
// leased: the lease another worker's name replaced) ends its completion
// span with status error and no state, and in held mode the failure then
// recorded on its own is a second completion span that records the retry.
func TestCompletionSpanRecordsOutcome(t *testing.T) {
	t.Parallel()
	for _, leased := range []bool{false, true} {
		name := map[bool]string{false: "held", true: "leased"}[leased]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			completionOutcomes(t, leased)
		})
	}
}

func completionOutcomes(t *testing.T, leased bool) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx := context.Background()
	pool := pgwaketest.Pool(t)
	var schema string
	cfg := queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {}},
		Hooks:  otelpgwake.Hooks(otelpgwake.Config{TracerProvider: tp}),
		Handlers: map[string]queue.Handler{
			"fail": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return errors.New("bad input") }),
			"drop": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
				return queue.Cancel(errors.New("customer deleted"))
			}),
			"nap": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return queue.Snooze(time.Hour) }),
			"lost": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				if leased { // the lease is no longer this worker's
					_, err := pool.Exec(ctx, `UPDATE `+schema+`.jobs SET leased_by = 'another worker' WHERE id = $1`, j.ID)
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.deferred VALUES (1)`) // fails at COMMIT
				return err
			}),
		},
	}
	if leased {
		cfg.LeasedKinds = []string{"fail", "drop", "nap", "lost"}
	}
	c := pgwaketest.NewClient(t, pool, cfg)
	schema = c.Schema()
	_, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.deferred (k int UNIQUE DEFERRABLE INITIALLY DEFERRED); INSERT INTO `+schema+`.deferred VALUES (1)`)
	require.NoError(t, err)

	ids := map[string]int64{}
	for _, kind := range []string{"fail", "drop", "nap", "lost"} {
		attempts := map[string]int{"fail": 1, "drop": 1, "nap": 1, "lost": 2}[kind]
		res, err := c.Enqueue(ctx, queue.NewJob{Kind: kind, MaxAttempts: attempts})
		require.NoError(t, err)
		ids[kind] = res.ID
		id, ok := pgwaketest.WorkOne(t, c)
		require.True(t, ok)
		require.Equal(t, res.ID, id)
	}
	pgwaketest.RequireState(t, c, ids["fail"], queue.StateFailed)
	pgwaketest.RequireState(t, c, ids["drop"], queue.StateCancelled)
	pgwaketest.RequireState(t, c, ids["nap"], queue.StatePending)
	spans := sr.Ended()

	// A snooze is no failure: no error status, the snooze said, the job
	// pending again.
	nap, napDone := spanOf(t, spans, otelpgwake.SpanWork, ids["nap"]), spanOf(t, spans, otelpgwake.SpanComplete, ids["nap"])
	require.Equal(t, codes.Unset, nap.Status().Code)
	require.Empty(t, nap.Events())
	require.Contains(t, nap.Attributes(), otelpgwake.AttrSnoozed.Bool(true))
	require.Contains(t, napDone.Attributes(), otelpgwake.AttrState.String(string(queue.StatePending)))
	require.Equal(t, codes.Unset, napDone.Status().Code)

	for kind, want := range map[string]queue.JobState{"fail": queue.StateFailed, "drop": queue.StateCancelled} {
		work, done := spanOf(t, spans, otelpgwake.SpanWork, ids[kind]), spanOf(t, spans, otelpgwake.SpanComplete, ids[kind])
		require.Equal(t, codes.Error, work.Status().Code, kind)
		require.Contains(t, done.Attributes(), otelpgwake.AttrState.String(string(want)), kind)
		require.Equal(t, codes.Unset, done.Status().Code, "%s: the write succeeded", kind)
		require.Contains(t, done.Attributes(), otelpgwake.AttrKind.String(kind))
		require.Equal(t, trace.SpanKindClient, done.SpanKind())
	}

	var lost []sdktrace.ReadOnlySpan
	for _, s := range byName(spans, otelpgwake.SpanComplete) {
		if slices.Contains(s.Attributes(), otelpgwake.AttrJobID.Int64(ids["lost"])) {
			lost = append(lost, s)
		}
	}
	require.NotEmpty(t, lost)
	require.Equal(t, codes.Error, lost[0].Status().Code, "the write of the outcome failed")
	require.NotEmpty(t, lost[0].Events(), "the error is recorded as an event")
	for _, kv := range lost[0].Attributes() {
		require.NotEqual(t, otelpgwake.AttrState, kv.Key, "a failed write records no state")
	}
	if leased {
		require.Len(t, lost, 1)
		require.Contains(t, lost[0].Status().Description, queue.ErrLeaseLost.Error())
		return
	}
	require.Len(t, lost, 2, "the commit's failure, then the attempt's failure recorded on its own")
	require.Contains(t, lost[0].Status().Description, "commit")
	require.Equal(t, codes.Unset, lost[1].Status().Code)
	require.Contains(t, lost[1].Attributes(), otelpgwake.AttrState.String(string(queue.StatePending)))
	pgwaketest.RequireState(t, c, ids["lost"], queue.StatePending)
}

// A job enqueued with metadata but no trace context (no tracing at the
// producer) gets spans with no link, under whatever span the worker's
// context holds.
func TestNoTraceContextNoLink(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	pool := pgwaketest.Pool(t)
	worker := pgwaketest.NewClient(t, pool, queue.Config{
		Hooks: otelpgwake.Hooks(otelpgwake.Config{TracerProvider: tp}),
		Handlers: map[string]queue.Handler{"a": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			return nil
		})},
	})
	producer, err := queue.New(pool, queue.Config{Schema: worker.Schema()}) // no hooks
	require.NoError(t, err)
	res, err := producer.Enqueue(context.Background(), queue.NewJob{Kind: "a", Metadata: map[string]string{"tenant": "7"}})
	require.NoError(t, err)

	ctx, loop := tp.Tracer("test").Start(context.Background(), "worker loop")
	id, ok, err := worker.WorkOne(ctx)
	loop.End()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, res.ID, id)
	for _, name := range []string{otelpgwake.SpanClaim, otelpgwake.SpanWork, otelpgwake.SpanComplete} {
		s := spanOf(t, sr.Ended(), name, id)
		require.Empty(t, s.Links(), name)
		require.Equal(t, loop.SpanContext().SpanID(), s.Parent().SpanID(), "%s: under the worker's span", name)
		require.False(t, s.Parent().IsRemote(), name)
	}
}
