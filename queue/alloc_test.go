package queue

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A successful attempt's own Go work (the handler's run with its timeout,
// then its report with debug logging off) allocates only the timeout's
// context and timer: the timeout's cause is made once per kind at New, not
// per attempt (fmt.Errorf, the duration's text), and the log fields of a
// success are built only when debug logging is on. 9 allocations an
// attempt before, 4 after.
func TestSuccessfulAttemptAllocations(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?pool_max_conns=40") // never connects
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := New(pool, Config{
		Queues: map[string]QueueConfig{"q": {}},
		Handlers: map[string]Handler{"k": HandlerFunc(func(context.Context, pgx.Tx, *Job) error {
			return nil
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	l := c.loops["q"]
	j := &Job{ID: 1, Queue: "q", Kind: "k", Attempt: 1}
	tx := &jobTx{}
	n := testing.AllocsPerRun(500, func() {
		herr := c.runHandler(ctx, tx, j)
		c.report(l, attemptResult{job: j, dur: time.Millisecond, err: herr})
	})
	t.Logf("%.1f allocations per successful attempt", n)
	if n > 4 {
		t.Errorf("%.1f allocations per successful attempt, want at most 4", n)
	}
}
