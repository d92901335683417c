package main

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// explainSchemaError turns "relation does not exist" (or a missing column or
// function: a schema migrated by an older pgwake) into a hint to migrate.
func explainSchemaError(err error, schema string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000" || pgErr.Code == "42703" || pgErr.Code == "42883") {
		return fmt.Errorf("pgwake's tables are missing in schema %s (%s); run `pgwake migrate --schema %s` first", schema, pgErr.Message, schema)
	}
	return err
}
