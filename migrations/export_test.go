package migrations

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// UpTo is Up applying migrations up to version limit only.
func UpTo(ctx context.Context, pool *pgxpool.Pool, schema string, limit int) ([]int, error) {
	return up(ctx, pool, schema, limit, Options{})
}
