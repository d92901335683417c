// Package sqlapi holds the tests of pgwake's SQL API (migration
// 0008_sql_api.sql, docs/sql.md): the same jobs enqueued through the Go
// client and through the SQL functions give the same rows and events,
// invalid input gets the documented SQLSTATE and writes nothing, an AFTER
// INSERT trigger enqueues in its transaction, and real clients (psql,
// Python psycopg, Node pg, Ruby pg, Java JDBC) enqueue in their own
// transactions with a business write. The clients are installed by
// scripts/install-test-clients.sh; a test whose client is missing skips and
// says how to install it.
//
// The package has no code of its own: the SQL API lives in the migrations.
package sqlapi
