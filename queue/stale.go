package queue

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A handler can drop its connection's prepared statements: DEALLOCATE
// sent as SQL, or run inside a function. pgx then still believes them
// prepared. It heals its statement cache one failed statement at a time,
// but a statement prepared by name (pgwake prepares its hot statements so)
// fails on that connection for ever, and each failure in the claim
// transaction aborts it. So a handler's DEALLOCATE through the job's
// transaction resynchronizes pgx (at once through Exec, when the handler
// returns otherwise; held and leased), and a connection where a
// statement failed as unknown to the server (SQLSTATE 26000) is closed
// instead of going back to the pool (TestHandlerDeallocatingStatements).

// staleStatement reports whether err says that a prepared statement the
// client used is unknown to the server.
func staleStatement(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "26000" // invalid_sql_statement_name
}

// check marks b's connection stale when err says so (staleStatement).
func (b *batch) check(err error) {
	if staleStatement(err) {
		b.discard = true
	}
}

// closeConn closes conn (its prepared statements are stale, or a handler
// changed its session); the pool discards a closed connection when it is
// released.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// closeIfStale closes conn when err says a statement on it is stale
// (staleStatement).
func closeIfStale(conn *pgx.Conn, err error) {
	if staleStatement(err) {
		closeConn(conn)
	}
}

// mentionsDeallocate reports whether sql may contain a DEALLOCATE statement
// (ASCII case-insensitive; a false positive costs one resynchronization).
func mentionsDeallocate(sql string) bool { return containsFold(sql, "deallocate") }

// containsFold reports whether sql contains word (lowercase ASCII), in any
// ASCII case, without allocating.
func containsFold(sql, word string) bool {
	first := word[0] &^ 0x20
	for i := 0; i+len(word) <= len(sql); i++ {
		if c := sql[i]; c != word[0] && c != first {
			continue
		}
		j := 1
		for ; j < len(word); j++ {
			if sql[i+j]|0x20 != word[j] {
				break
			}
		}
		if j == len(word) {
			return true
		}
	}
	return false
}
