package queue

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// jobSavepoint is the savepoint a handler's writes roll back to on failure.
const jobSavepoint = "pgwake_job"

// jobTx is the claim transaction as one handler sees it. The first use takes
// a savepoint, in a round trip of its own before the handler's statement (a
// statement that fails at Parse would otherwise abort the transaction before
// the savepoint existed), so a failure rolls back this handler's writes and
// nothing else of the batch; a handler that never touches the transaction
// costs no round trip. Commit and Rollback belong to pgwake.
//
// In leased mode begin is set and tx is nil until the first use, which
// begins a transaction (no savepoint: nothing else shares it); it commits
// with the job's completion.
type jobTx struct {
	tx        pgx.Tx
	savepoint bool
	batch     *batch                                    // the claimed batch, for CancelTx
	begin     func(ctx context.Context) (pgx.Tx, error) // leased mode
	// resync: the handler may have dropped the connection's prepared
	// statements (DEALLOCATE through Query, QueryRow or SendBatch); the
	// executor resynchronizes pgx when the handler returns (stale.go).
	resync bool
	// restore: the handler may have changed a setting pgwake's statements
	// run under; discard: one that outlives the transaction, so its
	// connection is closed, not returned to the pool (session.go).
	restore, discard bool
	// ended: the handler returned; the tx refuses further use
	// (ErrTxAfterHandler).
	ended atomic.Bool
}

var _ pgx.Tx = (*jobTx)(nil)

func (t *jobTx) ensure(ctx context.Context) error {
	if t.ended.Load() {
		return ErrTxAfterHandler
	}
	if t.begin != nil {
		if t.tx != nil {
			return nil
		}
		tx, err := t.begin(ctx)
		if err != nil {
			return err
		}
		t.tx = tx
		return nil
	}
	if t.savepoint {
		return nil
	}
	if _, err := t.tx.Exec(ctx, "SAVEPOINT "+jobSavepoint); err != nil {
		return err
	}
	t.savepoint = true
	return nil
}

// saw notes what the handler's statement sql may have changed: the
// connection's prepared statements (stale.go), settings (session.go).
func (t *jobTx) saw(sql string) {
	t.resync = t.resync || mentionsDeallocate(sql)
	changed, session := settingChanges(sql)
	t.restore = t.restore || changed
	t.discard = t.discard || session
}

// Begin starts a pseudo nested transaction (a savepoint), which notes and
// refuses what t does (nestedTx).
func (t *jobTx) Begin(ctx context.Context) (pgx.Tx, error) { //nolint:revive // pgx.Tx's name
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	tx, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &nestedTx{Tx: tx, job: t}, nil
}

// nestedTx is a handler's nested transaction: its statements are noted
// like the job's own (saw), and it is refused once the handler returned
// (ErrTxAfterHandler).
type nestedTx struct {
	pgx.Tx
	job *jobTx
}

func (n *nestedTx) check() error {
	if n.job.ended.Load() {
		return ErrTxAfterHandler
	}
	return nil
}

// Begin starts a further nested transaction.
func (n *nestedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := n.check(); err != nil {
		return nil, err
	}
	tx, err := n.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &nestedTx{Tx: tx, job: n.job}, nil
}

// Commit releases the savepoint.
func (n *nestedTx) Commit(ctx context.Context) error {
	if err := n.check(); err != nil {
		return err
	}
	return n.Tx.Commit(ctx)
}

// Rollback rolls back to the savepoint.
func (n *nestedTx) Rollback(ctx context.Context) error {
	if err := n.check(); err != nil {
		return err
	}
	return n.Tx.Rollback(ctx)
}

// CopyFrom runs COPY FROM in the nested transaction.
func (n *nestedTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := n.check(); err != nil {
		return 0, err
	}
	return n.Tx.CopyFrom(ctx, table, cols, src)
}

// SendBatch sends a batch in the nested transaction.
func (n *nestedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := n.check(); err != nil {
		return errBatch{err}
	}
	for _, q := range b.QueuedQueries {
		n.job.saw(q.SQL)
	}
	return n.Tx.SendBatch(ctx, b)
}

// Prepare prepares a statement on the connection.
func (n *nestedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := n.check(); err != nil {
		return nil, err
	}
	return n.Tx.Prepare(ctx, name, sql)
}

// Exec runs sql in the nested transaction.
func (n *nestedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := n.check(); err != nil {
		return pgconn.CommandTag{}, err
	}
	n.job.saw(sql)
	return n.Tx.Exec(ctx, sql, args...)
}

// Query runs sql in the nested transaction.
func (n *nestedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := n.check(); err != nil {
		return nil, err
	}
	n.job.saw(sql)
	return n.Tx.Query(ctx, sql, args...)
}

// QueryRow runs sql in the nested transaction.
func (n *nestedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := n.check(); err != nil {
		return errRow{err}
	}
	n.job.saw(sql)
	return n.Tx.QueryRow(ctx, sql, args...)
}

// Commit returns ErrTxOwned: return from the handler instead.
func (t *jobTx) Commit(context.Context) error { return ErrTxOwned }

// Rollback returns ErrTxOwned: return an error from the handler instead.
func (t *jobTx) Rollback(context.Context) error { return ErrTxOwned }

// CopyFrom runs COPY FROM in the claim transaction.
func (t *jobTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ensure(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, cols, src)
}

// SendBatch sends a batch in the claim transaction.
func (t *jobTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.ensure(ctx); err != nil {
		return errBatch{err}
	}
	for _, q := range b.QueuedQueries {
		t.saw(q.SQL)
	}
	return t.tx.SendBatch(ctx, b)
}

// LargeObjects gives access to large objects in the claim transaction.
func (t *jobTx) LargeObjects() pgx.LargeObjects {
	_ = t.ensure(context.Background())
	return t.tx.LargeObjects()
}

// Prepare prepares a statement on the claim transaction's connection.
func (t *jobTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// Exec runs sql in the claim transaction. After a DEALLOCATE, pgx forgets
// the connection's prepared statements too (stale.go).
func (t *jobTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.ensure(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	t.saw(sql)
	tag, err := t.tx.Exec(ctx, sql, args...)
	if err == nil && mentionsDeallocate(sql) {
		err = t.tx.Conn().DeallocateAll(ctx)
	}
	return tag, err
}

// Query runs sql in the claim transaction.
func (t *jobTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	t.saw(sql)
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow runs sql in the claim transaction.
func (t *jobTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.ensure(ctx); err != nil {
		return errRow{err}
	}
	t.saw(sql)
	return t.tx.QueryRow(ctx, sql, args...)
}

// Conn returns the claim transaction's connection. Writes made on it directly
// are part of the transaction too, so this takes the savepoint first.
func (t *jobTx) Conn() *pgx.Conn {
	_ = t.ensure(context.Background())
	return t.tx.Conn()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
