package queue

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
// In leased mode pool is set and tx is nil until the first use, which
// begins a transaction on a connection of its own (no savepoint: nothing
// else shares it); it commits with the job's completion, and giveBack
// returns the connection.
//
// A nested transaction (Begin) is a jobTx too, with parent set: what it
// sees and refuses is its root's.
type jobTx struct {
	tx        pgx.Tx
	savepoint bool
	batch     *batch        // the claimed batch, for CancelTx
	pool      *pgxpool.Pool // leased mode
	conn      *pgxpool.Conn // leased mode: tx's connection
	parent    *jobTx        // a nested transaction's
	// resync: the handler may have dropped the connection's prepared
	// statements (a DEALLOCATE); afterHandler resynchronizes pgx
	// (stale.go; Exec already did at once).
	resync bool
	// restore: the handler may have changed a setting pgwake's statements
	// run under; discard: one that outlives the transaction, so its
	// connection is closed, not returned to the pool (session.go).
	restore, discard bool
	// ended: the handler returned; the tx refuses further use
	// (ErrTxAfterHandler).
	ended atomic.Bool
	// open: the handler's results not yet read to their end or closed
	// (rows, a QueryRow not scanned, batch results), closed by closeLeft
	// once it returned: left open, they keep the connection busy and
	// pgwake's next statement on it fails (pgx's "conn busy").
	openMu sync.Mutex
	open   []leftOpen
	// role: the role the transaction ran as before the handler's first
	// statement that may change it (saw), nil if none did.
	role *string
	// idle: the claim's idle_in_transaction_session_timeout, which
	// afterHandler restores with the others ("": the default).
	idle string
	// cancels: the jobs CancelTx cancelled through this transaction.
	cancels []int64
}

// cancelledThrough reports whether CancelTx cancelled job id through t.
func (t *jobTx) cancelledThrough(id int64) bool { return slices.Contains(t.root().cancels, id) }

var _ pgx.Tx = (*jobTx)(nil)

// TxFailed reports whether a statement run in tx failed, leaving the
// transaction aborted: a handler that returns nil then fails its attempt
// (ErrTxAborted). For a job's tx (or a transaction begun in it) it asks
// nothing of the database and starts nothing: a tx the handler never used
// has not failed. For any other pgx.Tx it reads the connection's state.
func TxFailed(tx pgx.Tx) bool {
	t, ok := tx.(*jobTx)
	if !ok {
		return tx.Conn().PgConn().TxStatus() == 'E'
	}
	r := t.root()
	if r.tx == nil || (r.pool == nil && !r.savepoint) {
		return false // never used: nothing ran
	}
	return r.tx.Conn().PgConn().TxStatus() == 'E'
}

// root is the job's own jobTx (t, unless t is a nested transaction).
func (t *jobTx) root() *jobTx {
	for t.parent != nil {
		t = t.parent
	}
	return t
}

func (t *jobTx) ensure(ctx context.Context) error {
	if t.root().ended.Load() {
		return ErrTxAfterHandler
	}
	switch {
	case t.parent != nil:
		return nil
	case t.pool != nil:
		if t.tx != nil {
			return nil
		}
		conn, err := t.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			conn.Release()
			return err
		}
		t.conn, t.tx = conn, tx
		return nil
	case t.savepoint:
		return nil
	}
	if _, err := t.tx.Exec(ctx, "SAVEPOINT "+jobSavepoint); err != nil {
		return err
	}
	t.savepoint = true
	return nil
}

// saw notes what the handler's statement sql may have changed: the
// connection's prepared statements (stale.go), settings (session.go). It
// reports whether sql may hold a DEALLOCATE.
func (t *jobTx) saw(ctx context.Context, sql string) (deallocate bool, err error) {
	r := t.root()
	deallocate = mentionsDeallocate(sql)
	changed, session := settingChanges(sql)
	if changed && r.role == nil && mentionsRole(sql) {
		// The first statement that may change the role: read the role
		// the transaction runs as first, for afterHandler to put back
		// (restoreSettings; a role a pool's AfterConnect set is not the
		// connection's start value).
		var role string
		if err := t.tx.QueryRow(ctx, currentRole).Scan(&role); err != nil {
			return false, err
		}
		r.role = &role
	}
	r.resync = r.resync || deallocate
	r.restore = r.restore || changed
	r.discard = r.discard || session
	return deallocate, nil
}

// afterHandler runs on the job's transaction once the handler returned:
// after a DEALLOCATE it makes pgx forget the connection's statements too,
// or, in a transaction that can no longer run one, marks the connection to
// be closed (stale.go); after a handler that succeeded and changed a
// setting it restores the settings pgwake's statements run under, for the
// rest of the transaction (session.go).
func (t *jobTx) afterHandler(ctx context.Context, succeeded bool) error {
	if t.tx == nil {
		return nil
	}
	conn := t.tx.Conn()
	if t.resync {
		if conn.PgConn().TxStatus() != 'T' {
			t.discard = true
		} else if err := conn.DeallocateAll(ctx); err != nil {
			return err
		}
	}
	if t.restore && succeeded && conn.PgConn().TxStatus() == 'T' {
		_, err := t.tx.Exec(ctx, restoreSettings(t.role, t.idle))
		return err
	}
	return nil
}

// giveBack returns a leased job's connection to the pool once its
// transaction ended (or closes it: discard).
func (t *jobTx) giveBack() {
	if t.conn == nil {
		return
	}
	if t.discard {
		closeConn(t.conn.Conn())
	}
	t.conn.Release() // the pool discards it if still in a transaction
	t.conn = nil
}

// Begin starts a pseudo nested transaction (a savepoint).
func (t *jobTx) Begin(ctx context.Context) (pgx.Tx, error) { //nolint:revive // pgx.Tx's name
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	tx, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &jobTx{tx: tx, batch: t.batch, parent: t}, nil
}

// Commit returns ErrTxOwned: return from the handler instead. A nested
// transaction's releases its savepoint.
func (t *jobTx) Commit(ctx context.Context) error {
	if t.parent == nil {
		return ErrTxOwned
	}
	if err := t.ensure(ctx); err != nil {
		return err
	}
	return t.tx.Commit(ctx)
}

// Rollback returns ErrTxOwned: return an error from the handler instead. A
// nested transaction's rolls back to its savepoint.
func (t *jobTx) Rollback(ctx context.Context) error {
	if t.parent == nil {
		return ErrTxOwned
	}
	if err := t.ensure(ctx); err != nil {
		return err
	}
	return t.tx.Rollback(ctx)
}

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
		if _, err := t.saw(ctx, q.SQL); err != nil {
			return errBatch{err}
		}
	}
	br := &handlerBatch{BatchResults: t.tx.SendBatch(ctx, b), t: t.root()}
	br.t.track(br)
	return br
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
	deallocate, err := t.saw(ctx, sql)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := t.tx.Exec(ctx, sql, args...)
	if err == nil && deallocate {
		err = t.tx.Conn().DeallocateAll(ctx)
	}
	return tag, err
}

// Query runs sql in the claim transaction.
func (t *jobTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	if _, err := t.saw(ctx, sql); err != nil {
		return nil, err
	}
	rows, err := t.tx.Query(ctx, sql, args...)
	if err != nil {
		return rows, err
	}
	r := &handlerRows{Rows: rows, t: t.root()}
	r.t.track(r)
	return r, nil
}

// QueryRow runs sql in the claim transaction.
func (t *jobTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	// As pgx's QueryRow, on rows pgwake can close if Scan is never called.
	rows, err := t.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return handlerRow{rows}
}

// Conn returns the claim transaction's connection. Writes made on it directly
// are part of the transaction too, so this takes the savepoint first.
func (t *jobTx) Conn() *pgx.Conn {
	_ = t.ensure(context.Background())
	return t.tx.Conn()
}

// leftOpen is a handler's result that holds the connection until closed.
type leftOpen interface{ closeLeft() }

// track notes r as open until it is closed (forget).
func (t *jobTx) track(r leftOpen) {
	t.openMu.Lock()
	t.open = append(t.open, r)
	t.openMu.Unlock()
}

// forget notes that r was closed.
func (t *jobTx) forget(r leftOpen) {
	t.openMu.Lock()
	defer t.openMu.Unlock()
	for i, o := range t.open {
		if o == r {
			last := len(t.open) - 1
			t.open[i], t.open[last] = t.open[last], nil
			t.open = t.open[:last]
			return
		}
	}
}

// closeLeft closes what the handler left open, once it returned, and
// reports whether there was any (TestResultsLeftOpenAreClosed).
func (t *jobTx) closeLeft() bool {
	t.openMu.Lock()
	left := t.open
	t.open = nil
	t.openMu.Unlock()
	for _, r := range left {
		r.closeLeft()
	}
	return len(left) > 0
}

// handlerRows are a handler's rows, forgotten once read to their end or
// closed (pgx closes rows whose Next returned false).
type handlerRows struct {
	pgx.Rows
	t *jobTx
}

func (r *handlerRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.t.forget(r)
	return false
}

func (r *handlerRows) Close() {
	r.Rows.Close()
	r.t.forget(r)
}

func (r *handlerRows) closeLeft() { r.Rows.Close() }

// handlerRow is QueryRow's row: pgx's Scan of one row, on handlerRows.
type handlerRow struct{ rows pgx.Rows }

func (r handlerRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if err := r.rows.Err(); err != nil {
		return err
	}
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// handlerBatch is a handler's batch results, forgotten once closed.
type handlerBatch struct {
	pgx.BatchResults
	t *jobTx
}

func (b *handlerBatch) Close() error {
	err := b.BatchResults.Close()
	b.t.forget(b)
	return err
}

func (b *handlerBatch) closeLeft() { _ = b.BatchResults.Close() }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
