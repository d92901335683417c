package sqlident_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Literal's constant reads back as the string it was made from, with
// standard_conforming_strings on and off.
func TestLiteralReadsBack(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	for _, scs := range []string{"on", "off"} {
		for _, s := range []string{"q", "a.b-c_1", `it's`, `back\slash`, `\'; SELECT 1; --`, "", "é\n"} {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `SET LOCAL standard_conforming_strings = `+scs)
			require.NoError(t, err)
			var got string
			require.NoError(t, tx.QueryRow(ctx, `SELECT `+sqlident.Literal(s)).Scan(&got), "%q", s)
			require.Equal(t, s, got, "standard_conforming_strings=%s", scs)
			require.NoError(t, tx.Rollback(ctx))
		}
	}
}
