package queue

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrAlreadyRunning is returned by Run when the client is already running.
var ErrAlreadyRunning = errors.New("queue: client is already running")

// ErrNotStarted is returned by Stop when Start did not succeed.
var ErrNotStarted = errors.New("queue: Stop without a successful Start")

// ErrSchemaNotMigrated is returned by Run and Start when the schema lacks a
// migration this version of pgwake needs, and wraps the error of an
// enqueue, read, cancel, retry or pause call whose statement found a
// schema, table, column or function of pgwake missing (a producer deployed
// before its migration).
var ErrSchemaNotMigrated = errors.New("queue: schema not migrated")

// ErrNoQueues is returned by Run and Start when Config.Queues and
// Config.Periodic are empty.
var ErrNoQueues = errors.New("queue: no queues configured; set Config.Queues to run workers")

// ErrNotFound is returned by Cancel and Retry when no job matches in the
// required state.
var ErrNotFound = errors.New("queue: no such job in a state that allows this")

// ErrPoolTooSmall is matched (errors.Is) by the *PoolTooSmallError New
// returns when the pool cannot hold the workers and pgwake's own connections.
var ErrPoolTooSmall = errors.New("queue: pool too small for the workers")

// PoolTooSmallError says how many connections the pool has and needs; see
// MinPoolConns.
type PoolTooSmallError struct {
	MaxConns int // the pool's MaxConns
	Need     int // MinPoolConns of the config
}

func (e *PoolTooSmallError) Error() string {
	return fmt.Sprintf("queue: the pool has %d connections; the workers need at least %d "+
		"(the sum of MaxWorkers, one per queue, plus one; see MinPoolConns): raise pool_max_conns, "+
		"or set Config.AllowSmallPool to accept that the pool caps concurrency", e.MaxConns, e.Need)
}

// Is makes errors.Is(err, ErrPoolTooSmall) true.
func (e *PoolTooSmallError) Is(target error) bool { return target == ErrPoolTooSmall }

// ErrStopInHandler is returned by Stop called from one of the client's own
// handlers: the client stops once its running handlers (the caller's too)
// return; Stop did not wait for that.
var ErrStopInHandler = errors.New("queue: Stop called from one of the client's handlers: the client stops once its running handlers return, this one included; Stop did not wait")

// ErrTxOwned is returned when a handler tries to Commit or Rollback the claim
// transaction.
var ErrTxOwned = errors.New("queue: the claim transaction belongs to pgwake; return from the handler instead of committing or rolling back")

// ErrTxAfterHandler is returned when a job's tx is used after its handler
// returned (by a goroutine the handler started): the transaction then
// belongs to the job's completion or, in held mode, to the next job of the
// batch. It wraps pgx.ErrTxClosed.
var ErrTxAfterHandler = fmt.Errorf("queue: a job's tx used after its handler returned (wait for the goroutines that use it before returning): %w", pgx.ErrTxClosed)

// ErrTxEnded fails an attempt whose handler ended the claim transaction
// itself (a COMMIT or ROLLBACK sent as SQL). pgwake cannot tell which writes
// of the batch committed, so no job of that batch is marked succeeded.
var ErrTxEnded = errors.New("handler ended the claim transaction (COMMIT, ROLLBACK or END sent as SQL); the attempt failed and no job of its batch was marked succeeded")

// ErrTxAborted fails an attempt whose handler returned nil although a
// statement it ran in the claim transaction failed (leaving it aborted).
var ErrTxAborted = errors.New("handler returned nil but a statement it ran in the claim transaction failed; its writes were rolled back")

// ErrJobTimeout is wrapped by the error of an attempt that ran out of time.
var ErrJobTimeout = errors.New("job timed out")

// ErrAttemptLost is wrapped by the error recorded for an attempt that began
// and never recorded an outcome: the worker process died, its connection was
// lost or its claim transaction was ended (a failed COMMIT, a terminated
// session). The attempt counts like any failure.
var ErrAttemptLost = errors.New("attempt lost")

// PanicError is the error of an attempt whose handler panicked.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v\n%s", e.Value, e.Stack) }

// errCancelledWhileRunning is the cause of a held-mode handler's context
// when Cancel asked for its job while it ran.
var errCancelledWhileRunning = errors.New("cancelled while its handler ran (Client.Cancel)")

// ErrUniqueKeyHeld is matched (errors.Is) by the *UniqueKeyHeldError that
// Retry returns when the failed job's unique key is held by another job now.
var ErrUniqueKeyHeld = errors.New("queue: the job's unique key is held by another job")

// UniqueKeyHeldError says which job holds the unique key of a job Retry
// could not put back to pending. In RetryTx the transaction is aborted.
type UniqueKeyHeldError struct {
	JobID    int64 // the job to retry
	HolderID int64 // the job holding its key; 0 if it finished meanwhile
}

func (e *UniqueKeyHeldError) Error() string {
	return fmt.Sprintf("queue: retry job %d: its unique key is held by job %d", e.JobID, e.HolderID)
}

// Is makes errors.Is(err, ErrUniqueKeyHeld) true.
func (e *UniqueKeyHeldError) Is(target error) bool { return target == ErrUniqueKeyHeld }

// sqlstateUniqueKeyHeld is the SQL API's retry of a job whose key is held.
const sqlstateUniqueKeyHeld = "PW011"

// uniqueKeyHeld turns the SQL API's PW011 into a *UniqueKeyHeldError; nil
// for any other error.
func uniqueKeyHeld(id int64, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != sqlstateUniqueKeyHeld {
		return nil
	}
	holder, _ := strconv.ParseInt(pe.Detail, 10, 64)
	return &UniqueKeyHeldError{JobID: id, HolderID: holder}
}
