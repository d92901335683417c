package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// A migration that must wait for a long transaction using pgwake's tables
// (a held-mode job's claim, here an enqueue left open for 2 s) waits at
// most its lock timeout at a time, then rolls back and tries again later:
// the enqueues sent meanwhile do not queue behind its lock for the whole
// transaction, and it applies once the transaction ended. Before, Up waited
// without bound, and every enqueue and claim waited with it (an enqueue
// sent 0.5 s in waited 4.5 s of a 5 s transaction). With no try left it
// returns ErrLockTimeout.
func TestMigrateDoesNotStallTheQueueBehindALongTransaction(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := migrations.UpTo(ctx, pool, schema, 14)
	require.NoError(t, err)
	enqueue := `SELECT ` + sqlident.Quote(schema, "enqueue") + `('k')`

	long, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = long.Exec(ctx, enqueue)
	require.NoError(t, err)
	// Ends after migrate's fourth try and before its fifth (tries of
	// 500 ms, pauses of 250, 500, 1,000 and 2,000 ms: the fifth begins
	// at about 5.75 s).
	ended := time.AfterFunc(5*time.Second, func() { _ = long.Commit(ctx) })
	defer ended.Stop()

	upDone := make(chan error, 1)
	go func() {
		_, err := migrations.UpWithOptions(ctx, pool, schema, migrations.Options{LockTimeout: 500 * time.Millisecond})
		upDone <- err
	}()
	time.Sleep(500 * time.Millisecond)
	t0 := time.Now()
	_, err = pool.Exec(ctx, enqueue)
	require.NoError(t, err)
	// Without the bound it would wait about 4.5 s, for the long
	// transaction; with it, at most one try of 500 ms (and a margin).
	require.Less(t, time.Since(t0), 1500*time.Millisecond, "the enqueue did not wait for the long transaction behind migrate's lock")
	require.NoError(t, <-upDone, "applied once the transaction ended")
	st, err := migrations.StatusOf(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, migrations.Pending(st))

	// A transaction that outlasts every try: ErrLockTimeout.
	other := pgtest.Schema(t)
	_, err = migrations.UpTo(ctx, pool, other, 14)
	require.NoError(t, err)
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `SELECT `+sqlident.Quote(other, "enqueue")+`('k')`)
	require.NoError(t, err)
	_, err = migrations.UpWithOptions(ctx, pool, other, migrations.Options{LockTimeout: 50 * time.Millisecond})
	require.ErrorIs(t, err, migrations.ErrLockTimeout)
}
