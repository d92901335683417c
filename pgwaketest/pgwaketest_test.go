package pgwaketest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/pgwaketest"
	"github.com/pgwake/pgwake/queue"
)

func TestMain(m *testing.M) { pgwaketest.Main(m) }

// recorder is a testing.TB that records failures instead of ending the
// test, to show when a helper fails.
type recorder struct {
	testing.TB
	failures []string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}
func (r *recorder) Errorf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

// signup is the code under test: it enqueues a welcome mail in the
// caller's transaction.
func signup(ctx context.Context, c *queue.Client, tx pgx.Tx, email string) error {
	_, err := c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "mail", Payload: map[string]any{"to": email, "template": "welcome"}})
	return err
}

func TestRequireEnqueued(t *testing.T) {
	t.Parallel()
	pool := pgwaketest.Pool(t)
	c := pgwaketest.NewClient(t, pool, queue.Config{})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, signup(ctx, c, tx, "ann@example.com"))

	// Inside the transaction the job is there; outside, not yet.
	id := pgwaketest.RequireEnqueuedTx(t, c, tx, "mail", map[string]any{"to": "ann@example.com"})
	require.Positive(t, id)
	r := &recorder{TB: t}
	require.Zero(t, pgwaketest.RequireEnqueued(r, c, "mail", nil))
	require.Len(t, r.failures, 1, "RequireEnqueued fails before the commit")
	require.Contains(t, r.failures[0], `no job of kind "mail"`)
	require.Contains(t, r.failures[0], `there is no job of kind "mail"`)

	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, id, pgwaketest.RequireEnqueued(t, c, "mail", map[string]any{"to": "ann@example.com"}))
	require.Equal(t, id, pgwaketest.RequireEnqueued(t, c, "mail", json.RawMessage(`{"template": "welcome"}`)), "any subset of the payload")
	require.Equal(t, id, pgwaketest.RequireEnqueued(t, c, "mail", nil), "nil matches any payload")
	require.Equal(t, id, pgwaketest.RequireEnqueued(t, c, "mail", []byte(`{"template": "welcome"}`)),
		"[]byte is JSON text, as in queue.NewJob (it was marshalled to base64 and never matched)")
	require.Equal(t, id, pgwaketest.RequireEnqueued(t, c, "mail", json.RawMessage("")), "empty JSON text is {}, as in queue.NewJob")
	require.Equal(t, id, pgwaketest.RequireEnqueued(t, c, "mail", []byte{}), "empty JSON text is {}, as in queue.NewJob")
	r = &recorder{TB: t}
	require.Zero(t, pgwaketest.RequireEnqueued(r, c, "mail", `{"template": "welcome"}`))
	require.Len(t, r.failures, 1)
	require.Contains(t, r.failures[0], "a Go string", "refused as queue.NewJob refuses it")

	// The wrong payload, or the wrong kind, fails and says what is there.
	for _, tc := range []struct {
		kind    string
		payload any
		says    string
	}{
		{"mail", map[string]any{"to": "bob@example.com"}, fmt.Sprintf(`job %d (pending): {"to": "ann@example.com", "template": "welcome"}`, id)},
		{"sms", nil, `there is no job of kind "sms"`},
	} {
		r := &recorder{TB: t}
		require.Zero(t, pgwaketest.RequireEnqueued(r, c, tc.kind, tc.payload))
		require.Len(t, r.failures, 1)
		require.Contains(t, r.failures[0], tc.says)
	}
}

// WorkOne and Drain run jobs through their handlers in the test, with
// their outcomes recorded: a job its handler enqueues runs too, a failure
// is recorded, leased jobs work the same way, a job for later stays.
func TestWorkOneAndDrain(t *testing.T) {
	t.Parallel()
	pool := pgwaketest.Pool(t)
	ctx := context.Background()
	var sent []string
	var c *queue.Client
	c = pgwaketest.NewClient(t, pool, queue.Config{
		Queues:      map[string]queue.QueueConfig{"default": {}, "slow": {}},
		LeasedKinds: []string{"report"},
		Handlers: map[string]queue.Handler{
			"mail": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				var p struct{ To string }
				if err := json.Unmarshal(j.Payload, &p); err != nil {
					return err
				}
				if p.To == "" {
					return errors.New("no recipient")
				}
				sent = append(sent, p.To)
				return nil
			}),
			"signup": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				return signup(ctx, c, tx, "new@example.com")
			}),
			"report": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil }),
		},
	})
	_, ok := pgwaketest.WorkOne(t, c)
	require.False(t, ok, "nothing due")

	s, err := c.Enqueue(ctx, queue.NewJob{Kind: "signup"})
	require.NoError(t, err)
	bad, err := c.Enqueue(ctx, queue.NewJob{Kind: "mail", MaxAttempts: 1})
	require.NoError(t, err)
	rep, err := c.Enqueue(ctx, queue.NewJob{Kind: "report", Queue: "slow"})
	require.NoError(t, err)
	later, err := c.Enqueue(ctx, queue.NewJob{Kind: "mail", Payload: map[string]string{"to": "later@example.com"}, Delay: time.Hour})
	require.NoError(t, err)

	id, ok := pgwaketest.WorkOne(t, c)
	require.True(t, ok)
	require.Equal(t, s.ID, id, "the oldest due job of the first queue")
	pgwaketest.RequireState(t, c, s.ID, queue.StateSucceeded)
	mail := pgwaketest.RequireEnqueued(t, c, "mail", map[string]string{"to": "new@example.com"})

	ran := pgwaketest.Drain(t, c)
	require.ElementsMatch(t, []int64{bad.ID, mail, rep.ID}, ran)
	require.Equal(t, []string{"new@example.com"}, sent)
	pgwaketest.RequireState(t, c, mail, queue.StateSucceeded)
	pgwaketest.RequireState(t, c, bad.ID, queue.StateFailed)
	pgwaketest.RequireState(t, c, rep.ID, queue.StateSucceeded)
	pgwaketest.RequireState(t, c, later.ID, queue.StatePending)

	r := &recorder{TB: t}
	pgwaketest.RequireState(r, c, bad.ID, queue.StateSucceeded)
	require.Equal(t, []string{fmt.Sprintf("pgwaketest: job %d is failed, want succeeded (last error: no recipient)", bad.ID)}, r.failures)
}
