package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Attempt records (the attempts table, migration 0006). Before a batch's
// handlers run, its attempts are recorded as started in a transaction of
// their own; the claim transaction deletes the records as it records the
// outcomes. A record whose job is pending and unlocked is an attempt that
// began and recorded no outcome; claimRecovered finds it.
//
// When the worker survives the loss (a failed COMMIT, a lost connection), it
// knows which attempt was at fault, or that a lone job's was, and records that
// failure itself (afterLostTx). When its process died, every attempt it was
// running is lost at once, and any of them may have killed it. Such a job
// runs again as usual first (isolationRerun): a crash unrelated to it costs
// nothing. Lost again, it runs with nothing else running in its client
// (isolationAlone), and only a loss there is counted, as a failed attempt
// (ErrAttemptLost) with backoff. So a job that kills its process fails after
// MaxAttempts, at most three deaths per attempt, and the jobs that died with
// it are never charged.

// Isolation levels of an attempt record.
const (
	isolationNone  = 0 // ran as usual
	isolationRerun = 1 // re-run after its attempt was lost
	isolationAlone = 2 // re-run with nothing else running in its client
)

// nextIsolation is how a job claimed by claimRecovered runs, and whether its
// lost attempt counts instead.
func nextIsolation(la *lostAttempt, j *Job) (level int, count bool) {
	if la == nil || la.attempt != j.Attempt {
		return isolationNone, false // no record, or a stale one
	}
	if la.isolation >= isolationAlone {
		return 0, true
	}
	return la.isolation + 1, false
}

// sendStarts sends the record that the attempts of b's jobs started, on a
// pool connection and in a transaction of its own, and returns once the
// statement is written to the server (the handlers may start: a worker
// that dies now has handed the record over); wait returns its result, and
// may be called more than once.
// Reading the result overlaps the handlers, so the record costs the
// critical path no round trip. What it costs is the write, on the path
// from the claim to the first handler: the statement goes out through
// pgconn's pipeline with its parameters in text (pgx's batch took about
// 40 µs more to encode and send them), and into a corked socket (cork),
// uncorked by the goroutine that reads the answer while the handler runs.
func (c *Client) sendStarts(ctx context.Context, b *batch, level int) (wait func() error, err error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("record attempt start: %w", err)
	}
	// One autocommit statement; the table is unlogged, so its commit waits
	// for no WAL flush. A recovered job has a record to replace; a job
	// claimed as usual has none, or rarely a stale one of an earlier
	// attempt, replaced when the plain INSERT finds it.
	stmt := c.sql.recordStarts
	if level != isolationNone {
		stmt = c.sql.replaceStarts
	}
	// Prepared once per connection (primeClaims does it at start), so that
	// nothing below waits for the server.
	sd, err := conn.Conn().Prepare(ctx, stmt, stmt)
	if err != nil {
		closeIfStale(conn.Conn(), err)
		conn.Release()
		return nil, fmt.Errorf("record attempt start: %w", err)
	}
	params := c.startsParams(b, level)
	pc := conn.Conn().PgConn()
	uncork := cork(pc.Conn())
	p := pc.StartPipeline(ctx)
	p.SendQueryPrepared(sd.Name, params, nil, nil)
	if err := p.Sync(); err != nil {
		uncork()
		_ = p.Close()
		conn.Release()
		return nil, fmt.Errorf("record attempt start: %w", err)
	}
	var ids []int64 // for the test signal, taken before the handlers start
	if c.signals != nil {
		ids = b.ids()
	}
	done := make(chan error, 1)
	go func() {
		uncork()
		err := p.Close()
		var pe *pgconn.PgError
		if level == isolationNone && errors.As(err, &pe) && pe.Code == "23505" { // unique_violation: a stale record
			err = c.replaceStartsOn(ctx, conn.Conn(), params)
		}
		closeIfStale(conn.Conn(), err)
		conn.Release()
		if ts := c.signals; ts != nil && err == nil {
			ts.startsRecorded.signal(ids)
		}
		done <- err
	}()
	return sync.OnceValue(func() error {
		if err := <-done; err != nil {
			return fmt.Errorf("record attempt start: %w", err)
		}
		return nil
	}), nil
}

// startsParams is the parameters of recordStarts for b's jobs, in text:
// ids, queue, attempts, batch size, client id, isolation level.
func (c *Client) startsParams(b *batch, level int) [][]byte {
	ids := make([]byte, 0, 1+len(b.jobs)*8)
	attempts := make([]byte, 0, 1+len(b.jobs)*2)
	ids, attempts = append(ids, '{'), append(attempts, '{')
	for i, cj := range b.jobs {
		if i > 0 {
			ids, attempts = append(ids, ','), append(attempts, ',')
		}
		ids = strconv.AppendInt(ids, cj.job.ID, 10)
		attempts = strconv.AppendInt(attempts, int64(cj.job.Attempt), 10)
	}
	ids, attempts = append(ids, '}'), append(attempts, '}')
	return [][]byte{ids, []byte(b.jobs[0].job.Queue), attempts,
		strconv.AppendInt(nil, int64(len(b.jobs)), 10), []byte(c.id), strconv.AppendInt(nil, int64(level), 10)}
}

// replaceStartsOn runs replaceStarts with params on conn.
func (c *Client) replaceStartsOn(ctx context.Context, conn *pgx.Conn, params [][]byte) error {
	sd, err := conn.Prepare(ctx, c.sql.replaceStarts, c.sql.replaceStarts)
	if err != nil {
		return err
	}
	_, err = conn.PgConn().ExecPrepared(ctx, sd.Name, params, nil, nil).Close()
	return err
}

// forgetStarts deletes our records of jobs that never started (best effort:
// a record left behind only makes the job run alone next time).
func (c *Client) forgetStarts(ids []int64) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.pool.Exec(ctx, c.sql.forgetStarts, ids, c.id); err != nil {
		c.log.Info("could not delete attempt records of jobs that did not start", zap.Error(err))
	}
}

// lostError is the error recorded for an attempt that began and recorded no
// outcome.
func lostError(la *lostAttempt) error {
	return fmt.Errorf("%w: attempt %d began (worker %s) with nothing else running in its worker and recorded no outcome: "+
		"the worker process died or lost its claim transaction", ErrAttemptLost, la.attempt, la.clientID)
}

// countLost records the lost attempt of b's job (claimed by claimRecovered)
// as failed, in b's transaction, and commits.
func (c *Client) countLost(ctx context.Context, b *batch, l *queueLoop) {
	j := &b.jobs[0].job
	herr := lostError(b.lost)
	res, err := c.recordFailure(ctx, b.tx, j, herr)
	if err == nil {
		err = b.tx.Commit(ctx)
	}
	b.release()
	if err != nil {
		l.log.Warn("could not record a lost attempt; trying again later", zap.Int64("job_id", j.ID), zap.Error(err))
		return
	}
	c.report(l, attemptResult{job: j, err: herr, state: res.state, retryIn: res.retryIn})
}

// recordFailure applies the retry policy to a failed attempt of j and
// records it in tx. state "" means the attempt was superseded (someone else
// recorded it first).
func (c *Client) recordFailure(ctx context.Context, tx pgx.Tx, j *Job, herr error) (failRecord, error) {
	r, _, err := c.writeFailure(ctx, tx, c.sql.fail, int32(j.Attempt-1), j, herr)
	return r, err
}

// writeFailure applies the retry policy to a failed attempt of j and runs
// stmt, a fail statement ($1 id, $2 attempts as stmt expects them, $3 error,
// $4 state, $5 delay µs, $6 channel, $7 event type, then extra). ok is false when no row
// moved (the attempt was superseded, or the lease is not ours).
func (c *Client) writeFailure(ctx context.Context, q rowQuerier, stmt string, attempts int32, j *Job, herr error, extra ...any) (r failRecord, ok bool, err error) {
	d := c.decide(j, herr)
	args := append([]any{j.ID, attempts, truncateError(herr.Error(), c.cfg.MaxErrorBytes), d.state(),
		float64(d.delay.Microseconds()), c.channel, d.event}, extra...)
	var ms float64
	var woke int64
	err = q.QueryRow(ctx, stmt, args...).Scan(&r.state, &ms, &woke)
	if errors.Is(err, pgx.ErrNoRows) {
		return failRecord{}, false, nil
	}
	if err != nil {
		return failRecord{}, false, fmt.Errorf("record failure: %w", err)
	}
	r.retryIn = time.Duration(ms * float64(time.Millisecond))
	r.event = d.event
	return r, true, nil
}

// rowQuerier is a pool, a connection or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// failRecord is what recordFailure wrote.
type failRecord struct {
	state   JobState
	event   EventType // the event appended: retry_scheduled, failed, cancelled or snoozed
	retryIn time.Duration
}
