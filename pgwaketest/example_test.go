package pgwaketest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/pgwaketest"
	"github.com/pgwake/pgwake/queue"
)

// exampleT stands in for the *testing.T a test gets (examples get none):
// a failed helper panics, which fails the example, and cleanups run when
// the example ends.
type exampleT struct {
	testing.TB
	name     string
	cleanups []func()
}

func newExampleT(name string) *exampleT { return &exampleT{name: name} }

func (t *exampleT) Helper()                           {}
func (t *exampleT) Name() string                      { return t.name }
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (t *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *exampleT) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// done runs the cleanups, last registered first.
func (t *exampleT) done() {
	for _, f := range slices.Backward(t.cleanups) {
		f()
	}
}

// A test of code that enqueues a job in its own transaction: the job is
// visible inside the transaction before the commit, and to everyone after.
func ExampleRequireEnqueued() {
	t := newExampleT("ExampleRequireEnqueued") // in a test: the test's t
	defer t.done()
	ctx := context.Background()
	pool := pgwaketest.Pool(t)
	c := pgwaketest.NewClient(t, pool, queue.Config{})

	tx, _ := pool.Begin(ctx)
	_ = signup(ctx, c, tx, "ann@example.com") // the code under test: EnqueueTx
	pgwaketest.RequireEnqueuedTx(t, c, tx, "mail", map[string]any{"to": "ann@example.com"})
	_ = tx.Commit(ctx)

	id := pgwaketest.RequireEnqueued(t, c, "mail", map[string]any{"template": "welcome"})
	j, _ := c.JobGet(ctx, id)
	fmt.Println(j.Kind, j.State, string(j.Payload))
	// Output: mail pending {"to": "ann@example.com", "template": "welcome"}
}

// Drain runs every due job through its handler in the test's goroutine,
// including the jobs those handlers enqueue, with no worker running.
func ExampleDrain() {
	t := newExampleT("ExampleDrain")
	defer t.done()
	ctx := context.Background()
	var sent []string
	var c *queue.Client
	c = pgwaketest.NewClient(t, pgwaketest.Pool(t), queue.Config{
		Handlers: map[string]queue.Handler{
			"signup": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				var p struct{ Email string }
				if err := json.Unmarshal(j.Payload, &p); err != nil {
					return err
				}
				return signup(ctx, c, tx, p.Email) // enqueues a mail in the job's transaction
			}),
			"mail": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				var p struct{ To string }
				if err := json.Unmarshal(j.Payload, &p); err != nil {
					return err
				}
				sent = append(sent, p.To)
				return nil
			}),
		},
	})
	res, _ := c.Enqueue(ctx, queue.NewJob{Kind: "signup", Payload: map[string]string{"email": "bob@example.com"}})

	ran := pgwaketest.Drain(t, c)
	fmt.Println("jobs run:", len(ran))
	fmt.Println("mails sent:", sent)
	pgwaketest.RequireState(t, c, res.ID, queue.StateSucceeded)
	mail := pgwaketest.RequireEnqueued(t, c, "mail", map[string]any{"to": "bob@example.com"})
	pgwaketest.RequireState(t, c, mail, queue.StateSucceeded)
	// Output:
	// jobs run: 2
	// mails sent: [bob@example.com]
}

// WorkOne runs one due job: here its handler fails, the failure is
// recorded as a worker would record it (a retry after the backoff), and
// nothing else is due until then.
func ExampleWorkOne() {
	t := newExampleT("ExampleWorkOne")
	defer t.done()
	ctx := context.Background()
	c := pgwaketest.NewClient(t, pgwaketest.Pool(t), queue.Config{
		Handlers: map[string]queue.Handler{
			"charge": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
				return errors.New("card declined")
			}),
		},
	})
	res, _ := c.Enqueue(ctx, queue.NewJob{Kind: "charge", MaxAttempts: 3})

	id, ok := pgwaketest.WorkOne(t, c)
	fmt.Println("ran:", ok, id == res.ID)
	j, _ := c.JobGet(ctx, id)
	fmt.Printf("%s after attempt %d of %d: %s\n", j.State, j.Attempts, j.MaxAttempts, j.LastError)
	_, ok = pgwaketest.WorkOne(t, c)
	fmt.Println("another due:", ok)
	// Output:
	// ran: true true
	// pending after attempt 1 of 3: card declined
	// another due: false
}
