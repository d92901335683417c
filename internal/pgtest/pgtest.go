// Package pgtest gives tests a PostgreSQL database: $TEST_DATABASE_URL when
// set, otherwise a throwaway cluster (internal/pgcluster) started once per
// test binary. Use it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Tests then call Pool, NewPool and Schema. Missing PostgreSQL is a setup
// error, never a skip.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/pgcluster"
)

// EnvURL names the variable that points tests at an existing server. It
// must have wal_level=logical for the replication-based tests.
const EnvURL = "TEST_DATABASE_URL"

// SharedPoolMaxConns is the MaxConns of the pool returned by Pool.
const SharedPoolMaxConns = 40

var (
	mu       sync.Mutex
	started  bool
	url      string
	cluster  *pgcluster.Cluster
	shared   *pgxpool.Pool
	schemas  = map[string]bool{}
	schemaMu sync.Mutex
)

// Main is meant to be TestMain: it sets up the database, runs the tests,
// tears everything down and exits with m.Run's code. If it cannot get a
// database it prints why and exits 1.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main without the os.Exit, for a TestMain that has more to do
// afterwards (e.g. goleak.Find). Everything Run started (pools, the
// cluster, the signal handler) is gone when it returns.
func Run(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: no database for the tests: %v\n", err)
		return 1
	}

	sigs := make(chan os.Signal, 1)
	done := make(chan struct{})
	var handlerWG sync.WaitGroup
	if cluster != nil {
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		handlerWG.Add(1)
		go func() {
			defer handlerWG.Done()
			select {
			case sig := <-sigs:
				fmt.Fprintf(os.Stderr, "pgtest: got %v, stopping the test cluster\n", sig)
				if err := cluster.Stop(); err != nil {
					fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
				}
				code := 1
				if s, ok := sig.(syscall.Signal); ok {
					code = 128 + int(s)
				}
				os.Exit(code)
			case <-done:
			}
		}()
	}

	code := m.Run()

	if cluster != nil {
		signal.Stop(sigs)
		close(done)
		handlerWG.Wait()
	}
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: teardown: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func setup() error {
	mu.Lock()
	defer mu.Unlock()
	if started {
		return fmt.Errorf("pgtest: Main/Run called twice")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if u := os.Getenv(EnvURL); u != "" {
		if err := ping(ctx, u); err != nil {
			return fmt.Errorf("$%s is set but the server does not answer: %w", EnvURL, err)
		}
		url, started = u, true
		return nil
	}

	var logf func(string, ...any)
	if testing.Verbose() {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{Logf: logf})
	if err != nil {
		return fmt.Errorf("%w\n(or set %s to an existing server with wal_level=logical)", err, EnvURL)
	}
	cluster, url, started = c, c.URL, true
	return nil
}

func teardown() error {
	mu.Lock()
	defer mu.Unlock()
	if shared != nil {
		shared.Close()
		shared = nil
	}
	if cluster != nil {
		return cluster.Stop()
	}
	return nil
}

func ping(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// URL returns the database URL in use. It panics if Main has not run.
func URL() string {
	mu.Lock()
	defer mu.Unlock()
	if !started {
		panic("pgtest: URL called without pgtest.Main in TestMain")
	}
	return url
}

// Cluster returns the throwaway cluster, or nil when $TEST_DATABASE_URL
// was given.
func Cluster() *pgcluster.Cluster {
	mu.Lock()
	defer mu.Unlock()
	return cluster
}

// RestartableCluster returns a server this test may restart or stop: the
// test binary's own cluster, or, when $TEST_DATABASE_URL points at a server
// that is not ours, a private throwaway cluster stopped at tb.Cleanup. Tests
// that need restarts use it instead of skipping.
func RestartableCluster(tb testing.TB) *pgcluster.Cluster {
	tb.Helper()
	if c := Cluster(); c != nil {
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		tb.Fatalf("pgtest: private cluster: %v", err)
	}
	tb.Cleanup(func() { _ = c.Stop() })
	return c
}

// PoolOn returns a pool on url (closed at tb.Cleanup), for a server other
// than URL(), such as a private RestartableCluster.
func PoolOn(tb testing.TB, url string, mutate func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	p, err := newPool(url, mutate)
	if err != nil {
		tb.Fatalf("pgtest: pool on %s: %v", url, err)
	}
	tb.Cleanup(p.Close)
	return p
}

// Pool returns the test binary's shared pool (MaxConns 40), created on
// first use and closed by Main at the end. Do not Close it.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if !started {
		tb.Fatal("pgtest: Pool called without pgtest.Main in TestMain")
	}
	if shared != nil {
		return shared
	}
	p, err := newPool(url, func(cfg *pgxpool.Config) { cfg.MaxConns = SharedPoolMaxConns })
	if err != nil {
		tb.Fatalf("pgtest: shared pool: %v", err)
	}
	shared = p
	return shared
}

// NewPool returns a separate pool on URL(), after mutate (may be nil) has
// adjusted its config; it is closed at tb.Cleanup.
func NewPool(tb testing.TB, mutate func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	return PoolOn(tb, URL(), mutate)
}

func newPool(u string, mutate func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, err
	}
	if mutate != nil {
		mutate(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// SchemaMaxLen bounds the names Schema returns.
const SchemaMaxLen = 40

// Schema returns a fresh schema name "t_<test name>_<8 hex>" (lowercase,
// [a-z0-9_], at most 40 bytes) that does not exist yet; Schema does not
// create it. At tb.Cleanup the schema is dropped with DROP SCHEMA IF EXISTS
// ... CASCADE, ignoring errors.
func Schema(tb testing.TB) string {
	tb.Helper()
	return SchemaOn(tb, Pool(tb))
}

// SchemaOn is Schema on the server behind pool (a private cluster, or the
// shared server through a pool with other settings).
func SchemaOn(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	base := sanitize(tb.Name(), SchemaMaxLen-len("t_")-len("_")-8)
	for i := 0; i < 10; i++ {
		name := "t_" + base + "_" + randomHex(4)
		if base == "" {
			name = "t_" + randomHex(4)
		}
		schemaMu.Lock()
		taken := schemas[name]
		schemas[name] = true
		schemaMu.Unlock()
		if taken {
			continue
		}
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", name).Scan(&exists); err != nil {
			tb.Fatalf("pgtest: Schema: %v", err)
		}
		if exists {
			continue
		}
		tb.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
		})
		return name
	}
	tb.Fatal("pgtest: Schema: no free name after 10 tries")
	return ""
}

// sanitize lowercases s, maps every run of characters outside [a-z0-9] to
// one '_', trims '_' at both ends and cuts the result to max bytes.
func sanitize(s string, max int) string {
	var b strings.Builder
	under := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			under = false
		} else if !under {
			b.WriteByte('_')
			under = true
		}
	}
	out := strings.Trim(b.String(), "_")
	if len(out) > max {
		out = strings.TrimRight(out[:max], "_")
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}

// RunInBackground runs run (a Client's, Stream's or Listener's Run) in a
// goroutine until the returned stop is called or the test ends. stop cancels
// its context and requires it to return nil within two minutes; otherwise
// the test fails with a goroutine dump. stop is safe to call twice.
func RunInBackground(tb testing.TB, what string, run func(context.Context) error) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("%s: Run returned %v", what, err)
				}
			case <-time.After(2 * time.Minute):
				var buf strings.Builder
				_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
				tb.Errorf("%s: Run did not return within 2m of cancel; goroutines:\n%s", what, buf.String())
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}

// WaitFor checks cond every 20 ms until it holds, and fails the test if it
// does not within d. Tests wait on a condition they can observe, never on a
// fixed sleep.
func WaitFor(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
