package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
)

// TestMain gives every test of package main (CLI tests and the events and
// bench commands' tests alike) a PostgreSQL through pgtest.
func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

// pgwakeBin builds the pgwake binary once per test run and returns its path.
func pgwakeBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "pgwake-cli-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "pgwake")
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go") //nolint:staticcheck // the toolchain running this test
		}
		out, err := exec.Command(goTool, "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = &buildError{out: string(out), err: err}
		}
	})
	require.NoError(t, binErr)
	return binPath
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + "\n" + e.out }

// cliEnvVars is the environment of a pgwake run: the test process's, minus
// anything that would point it at another database.
func cliEnvVars(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case envDatabaseURL, envFallbackURL, envSchema, envLogLevel, "PGWAKE_LISTENER_URL":
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// result is a finished pgwake run.
type result struct {
	stdout, stderr string
	code           int
}

// pgwake runs the binary to completion (60s at most) with stdin and the
// test database in PGWAKE_DATABASE_URL.
func pgwake(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return pgwakeEnv(t, []string{envDatabaseURL + "=" + pgtest.URL()}, stdin, args...)
}

func pgwakeEnv(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, pgwakeBin(t), args...)
	cmd.Env = cliEnvVars(env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "pgwake %v: %v", args, err)
		code = ee.ExitCode()
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// mustRun runs pgwake and requires exit status 0.
func mustRun(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	r := pgwake(t, stdin, args...)
	require.Equal(t, 0, r.code, "pgwake %v\nstdout: %s\nstderr: %s", args, r.stdout, r.stderr)
	return r.stdout
}

// syncBuffer is a bytes.Buffer safe for a process writing and a test reading.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// process is a pgwake run in the background (a worker).
type process struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	err            error
}

func startPgwake(t *testing.T, args ...string) *process {
	t.Helper()
	cmd := exec.Command(pgwakeBin(t), args...)
	cmd.Env = cliEnvVars(envDatabaseURL + "=" + pgtest.URL())
	p := &process{t: t, cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("pgwake %v stderr:\n%s", args, p.stderr.String())
		}
	})
	return p
}

func (p *process) signal(sig syscall.Signal) { require.NoError(p.t, p.cmd.Process.Signal(sig)) }

// wait returns the exit code, failing the test after 60s.
func (p *process) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.t.Fatalf("pgwake did not exit within 60s; stderr:\n%s", p.stderr.String())
	}
	if p.err == nil {
		return 0
	}
	ee, ok := p.err.(*exec.ExitError)
	require.True(p.t, ok, "%v", p.err)
	return ee.ExitCode()
}

// waitStderr waits until stderr matches re and returns the first submatch.
func (p *process) waitStderr(re *regexp.Regexp) string {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(p.stderr.String()); m != nil {
			if len(m) > 1 {
				return m[1]
			}
			return m[0]
		}
		select {
		case <-p.done:
			p.t.Fatalf("pgwake exited before printing %s; stderr:\n%s", re, p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	p.t.Fatalf("pgwake did not print %s within 60s; stderr:\n%s", re, p.stderr.String())
	return ""
}

// waitFor polls cond until it holds, failing after 60s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, 60*time.Second, what, cond)
}
