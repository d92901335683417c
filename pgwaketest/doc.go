// Package pgwaketest helps users test code that enqueues and handles pgwake
// jobs, against a real PostgreSQL:
//
//	func TestMain(m *testing.M) { pgwaketest.Main(m) }
//
//	func TestSignupSendsMail(t *testing.T) {
//		c := pgwaketest.NewClient(t, pgwaketest.Pool(t), queue.Config{
//			Handlers: map[string]queue.Handler{"mail": mailHandler},
//		})
//		signup(ctx, c, "ann@example.com") // enqueues {"to": "ann@example.com"}
//		id := pgwaketest.RequireEnqueued(t, c, "mail", map[string]any{"to": "ann@example.com"})
//		pgwaketest.Drain(t, c) // runs it, and anything it enqueues, now
//		pgwaketest.RequireState(t, c, id, queue.StateSucceeded)
//	}
//
// Main gives the test binary a database: $TEST_DATABASE_URL when set,
// otherwise a throwaway cluster it starts (PostgreSQL's server binaries,
// initdb and postgres, must be installed) and removes at the end. Each
// Schema (and NewClient) is a fresh, migrated schema dropped at cleanup, so
// tests run in parallel without seeing each other's jobs. WorkOne and Drain
// run jobs through their handlers in the test's goroutine, recording
// outcomes as a worker does, without Run. The examples run under go test
// (with this package's TestMain, so on a real database). See
// docs/testing.md.
package pgwaketest
