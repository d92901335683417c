package queue_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// The SQL API refuses the kinds ValidateKind refuses (queue.New refuses a
// handler for such a kind). enqueue() accepted U+00A0, U+2007, U+200B,
// U+00AD, U+FEFF, U+E000, U+FFF9 before migration 0024: jobs no client
// could register a handler for.
func TestSQLKindAgreesWithValidateKind(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	for _, r := range []rune{0x00a0, 0x2007, 0x202f, 0x200b, 0x00ad, 0xfeff, 0xe000, 0xfff9} {
		kind := "k" + string(r)
		require.Error(t, queue.ValidateKind(kind))
		_, err := e.pool.Exec(context.Background(), `SELECT `+e.table("enqueue")+`($1)`, kind)
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe, "%U", r)
		require.Equal(t, "PW001", pe.Code, "%U", r)
	}
	require.Zero(t, e.count(`true`))
	// Printable characters beyond ASCII are kinds, in both.
	for _, kind := range []string{"émail", "送信", "a.b-c_d:e/f"} {
		require.NoError(t, queue.ValidateKind(kind))
		_, err := e.pool.Exec(context.Background(), `SELECT `+e.table("enqueue")+`($1)`, kind)
		require.NoError(t, err, kind)
	}
	require.Equal(t, 3, e.count(`true`))
}
