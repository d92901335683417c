package queue

import (
	"context"
	"fmt"

	"github.com/pgwake/pgwake/migrations"
)

// Migrate applies every pending migration to the client's schema
// (Config.Schema) and returns the versions it applied: the schema is named
// once, in Config, and migrating and working cannot disagree. It is
// migrations.Up on the client's pool and schema; run it once per deploy
// (concurrent calls are serialized by a lock on the schema's
// schema_migrations table).
func (c *Client) Migrate(ctx context.Context) ([]int, error) {
	applied, err := migrations.Up(ctx, c.pool, c.cfg.Schema)
	if err != nil {
		return applied, fmt.Errorf("queue: migrate schema %s: %w", c.cfg.Schema, err)
	}
	return applied, nil
}
