package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func startCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		// Never skip: missing binaries are a setup error (see .ci/run).
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return c
}

func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func show(t *testing.T, ctx context.Context, conn *pgx.Conn, name string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
		t.Fatalf("SHOW %s: %v", name, err)
	}
	return v
}

func TestFindBinDir(t *testing.T) {
	dir, err := FindBinDir()
	if err != nil {
		t.Fatalf("FindBinDir: %v", err)
	}
	for _, bin := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			t.Errorf("%s: %v", bin, err)
		}
	}

	t.Setenv(EnvBinDir, dir)
	if got, err := FindBinDir(); err != nil || got != dir {
		t.Errorf("with $%s=%s: got %q, %v", EnvBinDir, dir, got, err)
	}
	t.Setenv(EnvBinDir, t.TempDir())
	_, err = FindBinDir()
	if !errors.Is(err, ErrNoServerBinaries) {
		t.Fatalf("bogus $%s: got %v, want ErrNoServerBinaries", EnvBinDir, err)
	}
	if !strings.Contains(err.Error(), "apt-get install postgresql") {
		t.Errorf("error lacks install hint: %v", err)
	}
}

func TestParseVersionOrder(t *testing.T) {
	vs := [][]int{parseVersion("9.6"), parseVersion("15"), parseVersion("10"), parseVersion("x")}
	if !versionLess(vs[0], vs[2]) || !versionLess(vs[2], vs[1]) || !versionLess(vs[3], vs[0]) {
		t.Fatalf("bad order: %v", vs)
	}
}

func TestRenderExtraConf(t *testing.T) {
	got, err := renderExtraConf(map[string]string{
		"log_min_messages":         "debug1",
		"application_name":         "it's",
		"shared_preload_libraries": "'pg_stat_statements'",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"application_name = 'it''s'\n",
		"log_min_messages = 'debug1'\n",
		"shared_preload_libraries = 'pg_stat_statements'\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if _, err := renderExtraConf(map[string]string{"bad key": "1"}); err == nil {
		t.Error("bad key accepted")
	}
}

func TestCluster(t *testing.T) {
	c := startCluster(t, Options{ExtraConf: map[string]string{"application_name": "pgcluster_test"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if !strings.HasPrefix(c.URL, "postgres://postgres:") || c.Port <= 0 {
		t.Fatalf("URL %q Port %d", c.URL, c.Port)
	}
	// Another OS user of the machine reaches the port, not the password
	// (nor the socket directory): refused.
	for _, u := range []string{
		fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port),
		fmt.Sprintf("postgres://postgres:wrong@127.0.0.1:%d/postgres?sslmode=disable", c.Port),
		fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&replication=database", c.Port),
	} {
		conn, err := pgconn.Connect(ctx, u)
		var pgErr *pgconn.PgError
		if err == nil {
			conn.Close(ctx)
			t.Fatalf("connected to %s without the password", u)
		} else if !errors.As(err, &pgErr) || pgErr.Code != "28P01" { // invalid_password
			t.Fatalf("connect %s: want invalid_password, got %v", u, err)
		}
	}
	for _, dir := range []string{c.baseDir, filepath.Join(c.baseDir, "sock")} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm()&0o077 != 0 {
			t.Fatalf("%s: want no access for group and others, got %v %v", dir, fi.Mode(), err)
		}
	}
	conn := connect(t, ctx, c.URL)
	if got := show(t, ctx, conn, "wal_level"); got != "logical" {
		t.Errorf("wal_level = %q, want logical", got)
	}
	if got := show(t, ctx, conn, "max_replication_slots"); got != "20" {
		t.Errorf("max_replication_slots = %q, want 20", got)
	}
	if got := show(t, ctx, conn, "max_connections"); got != "200" {
		t.Errorf("max_connections = %q, want 200", got)
	}
	if got := show(t, ctx, conn, "application_name"); got != "pgcluster_test" {
		t.Errorf("application_name (ExtraConf) = %q", got)
	}
	if got := show(t, ctx, conn, "server_encoding"); got != "UTF8" {
		t.Errorf("server_encoding = %q", got)
	}

	t.Run("LogicalSlot", func(t *testing.T) {
		// Over a replication connection, as pglogrepl would do it.
		rc, err := pgconn.Connect(ctx, c.URL+"&replication=database")
		if err != nil {
			t.Fatalf("replication connect: %v", err)
		}
		defer rc.Close(context.Background())
		res := rc.Exec(ctx, "CREATE_REPLICATION_SLOT pgcluster_test_slot TEMPORARY LOGICAL pgoutput")
		if _, err := res.ReadAll(); err != nil {
			t.Fatalf("CREATE_REPLICATION_SLOT: %v", err)
		}

		// And via SQL on a normal connection.
		var lsn string
		if err := conn.QueryRow(ctx,
			"SELECT lsn::text FROM pg_create_logical_replication_slot('pgcluster_sql_slot', 'pgoutput')").Scan(&lsn); err != nil {
			t.Fatalf("pg_create_logical_replication_slot: %v", err)
		}
		var n int
		if err := conn.QueryRow(ctx,
			"SELECT count(*) FROM pg_replication_slots WHERE slot_name IN ('pgcluster_sql_slot', 'pgcluster_test_slot') AND plugin = 'pgoutput'").Scan(&n); err != nil || n != 2 {
			t.Fatalf("slots found: %d, %v", n, err)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot('pgcluster_sql_slot')"); err != nil {
			t.Fatalf("pg_drop_replication_slot: %v", err)
		}
	})

	t.Run("PostmasterPID", func(t *testing.T) {
		pid, err := c.PostmasterPID()
		if err != nil {
			t.Fatal(err)
		}
		var backendPID int
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backendPID); err != nil {
			t.Fatal(err)
		}
		if pid == backendPID || !processAlive(pid) {
			t.Fatalf("postmaster pid %d (backend %d) alive=%v", pid, backendPID, processAlive(pid))
		}
		// SIGSTOP freezes new connections; SIGCONT resumes.
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		shortCtx, shortCancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err = pgx.Connect(shortCtx, c.URL)
		shortCancel()
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err == nil {
			t.Fatal("connected to a SIGSTOPped postmaster")
		}
		connect(t, ctx, c.URL)
	})

	t.Run("RestartFast", func(t *testing.T) {
		oldPID, _ := c.PostmasterPID()
		if err := c.Restart(ctx, "fast"); err != nil {
			t.Fatal(err)
		}
		newPID, err := c.PostmasterPID()
		if err != nil || newPID == oldPID {
			t.Fatalf("postmaster pid before %d after %d (%v)", oldPID, newPID, err)
		}
		// The old connection is gone...
		if err := conn.Ping(ctx); err == nil {
			t.Error("old connection survived a restart")
		}
		// ...a new one on the same URL works.
		conn2 := connect(t, ctx, c.URL)
		if got := show(t, ctx, conn2, "wal_level"); got != "logical" {
			t.Errorf("after restart wal_level = %q", got)
		}
	})

	t.Run("RestartImmediateWhileStopped", func(t *testing.T) {
		pid, err := c.PostmasterPID()
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if err := c.Restart(ctx, "immediate"); err != nil {
			t.Fatal(err)
		}
		connect(t, ctx, c.URL)
	})

	if err := c.Restart(ctx, "bogus"); err == nil {
		t.Error("Restart accepted mode bogus")
	}

	t.Run("Stop", func(t *testing.T) {
		pid, err := c.PostmasterPID()
		if err != nil {
			t.Fatal(err)
		}
		base := filepath.Dir(c.DataDir)
		if err := c.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := c.Stop(); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
		for _, p := range []string{c.DataDir, base} {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still exists (%v)", p, err)
			}
		}
		if processAlive(pid) {
			t.Errorf("postmaster %d still alive", pid)
		}
		if _, err := c.PostmasterPID(); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("PostmasterPID after Stop: %v", err)
		}
		if err := c.Restart(ctx, "fast"); err == nil {
			t.Error("Restart after Stop succeeded")
		}
	})
}

// Two clusters side by side get different ports and directories.
func TestTwoClusters(t *testing.T) {
	a := startCluster(t, Options{})
	b := startCluster(t, Options{})
	if a.Port == b.Port || a.DataDir == b.DataDir {
		t.Fatalf("clusters collide: %d %s / %d %s", a.Port, a.DataDir, b.Port, b.DataDir)
	}
}

// Stop is safe to call from several goroutines at once.
func TestConcurrentStop(t *testing.T) {
	c := startCluster(t, Options{})
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() { errs <- c.Stop() }()
	}
	for i := 0; i < 3; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// A cluster whose owning process died is reaped by the next Start.
func TestReapStale(t *testing.T) {
	c := startCluster(t, Options{})
	pid, err := c.PostmasterPID()
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Dir(c.DataDir)
	// Pretend the owner is a process that no longer exists.
	if err := os.WriteFile(filepath.Join(base, ownerFile), []byte("2147483646\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	reapStale(filepath.Dir(base), t.Logf)
	if _, err := os.Stat(base); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s not removed (%v)", base, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if processAlive(pid) {
		t.Errorf("stale postmaster %d still alive", pid)
	}
}
