// Package migrations holds pgwake's numbered SQL migrations, embedded in the
// binary, and the migrator that applies them.
//
// Up is safe to call from many processes at once: it takes a PostgreSQL
// advisory lock per schema, applies what is missing in order (each file in its
// own transaction) and records each version in <schema>.schema_migrations.
// Calling it again is a no-op.
package migrations
