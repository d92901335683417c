// Package migrations holds pgwake's numbered SQL migrations, embedded in the
// binary, and the migrator that applies them.
//
// Up is safe to call from many processes at once: it locks the schema's
// schema_migrations table, applies what is missing in order in one
// transaction (each lock wait bounded, tried again later when it times
// out) and records each version in <schema>.schema_migrations. Calling it
// again is a no-op.
package migrations
