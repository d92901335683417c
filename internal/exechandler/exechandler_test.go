package exechandler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// TestHandlerEnvironmentHasNoConnectionSettings runs a handler command that
// prints its environment: pgwake's URLs, DATABASE_URL and the libpq
// variables are gone (other variables stay) unless they are passed on
// purpose (--handler-connection-env).
func TestHandlerEnvironmentHasNoConnectionSettings(t *testing.T) {
	t.Parallel()
	environ := []string{
		"PATH=/usr/bin:/bin", "HOME=/home/app", "APP_SETTING=kept",
		"PGWAKE_DATABASE_URL=postgres://app:s3cretPW@db/app", "DATABASE_URL=postgres://app:s3cretPW@db/app",
		"PGWAKE_LISTENER_URL=postgres://app:s3cretPW@db/app", "PGWAKE_BROKER_URL=amqp://app:s3cretPW@mq/",
		"PGPASSWORD=s3cretPW", "PGSSLPASSWORD=s3cretPW", "PGHOST=db", "PGUSER=app", "PGSERVICE=pgwake",
		"PGCHANNELBINDING=require", "PGTZ=UTC", "PGREQUIREAUTH=scram-sha-256",
	}
	run := func(pass bool) string {
		var out bytes.Buffer
		h := &Handler{Command: "env", Env: Environ(environ, pass), Stdout: &out, Stderr: &out, Procs: NewProcGroups()}
		require.NoError(t, h.Handle(context.Background(), nil, &queue.Job{ID: 7, Kind: "k", Queue: "q", Attempt: 1, MaxAttempts: 1}))
		return out.String()
	}
	got := run(false)
	require.NotContains(t, got, "s3cretPW")
	for _, k := range []string{"PGHOST=", "PGUSER=", "PGSERVICE=", "DATABASE_URL=", "PGWAKE_LISTENER_URL=", "PGCHANNELBINDING=", "PGTZ=", "PGREQUIREAUTH="} {
		require.NotContains(t, got, k)
	}
	require.Contains(t, got, "APP_SETTING=kept")
	require.Contains(t, got, "HOME=/home/app")
	require.Contains(t, got, "PGWAKE_JOB_ID=7")
	passed := run(true)
	require.Contains(t, passed, "PGPASSWORD=s3cretPW")
	require.Contains(t, passed, "PGWAKE_DATABASE_URL=postgres://app:s3cretPW@db/app")
	require.True(t, strings.Contains(passed, "PGWAKE_JOB_ID=7"))
}

// TestHandlerOutputIsPrefixedAndEscaped: every line a handler command
// writes reaches the worker's output prefixed with its job and with control
// characters escaped, so it can neither pass for one of pgwake's log lines
// nor drive the terminal; a last line without a newline is kept, a very long
// line is cut into pieces that are each prefixed.
func TestHandlerOutputIsPrefixedAndEscaped(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	h := &Handler{
		Command: `printf '2026-01-01T00:00:00.000Z\tINFO\tworker\tjob succeeded\n\033]0;pwned\007\033[2J\r\nlast'; ` +
			`printf 'oops\n' >&2; head -c 40000 /dev/zero | tr '\0' x`,
		Env: []string{"PATH=/usr/bin:/bin"}, Stdout: &stdout, Stderr: &stderr, Procs: NewProcGroups(),
	}
	require.NoError(t, h.Handle(context.Background(), nil, &queue.Job{ID: 42, Kind: "k", Queue: "q", Attempt: 1, MaxAttempts: 1}))
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	require.Equal(t, "job 42 k stdout: 2026-01-01T00:00:00.000Z\\x09INFO\\x09worker\\x09job succeeded", lines[0])
	require.Equal(t, `job 42 k stdout: \x1b]0;pwned\x07\x1b[2J`, lines[1])
	require.True(t, strings.HasPrefix(lines[2], "job 42 k stdout: last"), lines[2])
	require.Greater(t, len(lines), 4, "a 40,000-byte line is cut into pieces")
	for _, l := range lines {
		require.True(t, strings.HasPrefix(l, "job 42 k stdout: "), "%.80q", l)
		require.LessOrEqual(t, len(l), lineWriterMax+len("job 42 k stdout: "))
	}
	require.Equal(t, "job 42 k stderr: oops\n", stderr.String())
}

func TestTailBuffer(t *testing.T) {
	t.Parallel()
	tb := &tailBuffer{max: 10}
	require.Equal(t, "", tb.suffix())
	_, _ = tb.Write([]byte("  hello  \n"))
	require.Equal(t, ": hello", tb.suffix())
	_, _ = tb.Write([]byte("0123456789abc"))
	require.Equal(t, ": ...3456789abc", tb.suffix())
}

func TestParseControl(t *testing.T) {
	t.Parallel()
	for line, want := range map[string]control{
		"snooze 30s":             {verb: "snooze", delay: 30 * time.Second},
		"cancel":                 {verb: "cancel"},
		"cancel  not wanted ":    {verb: "cancel", reason: "not wanted"},
		"retry-after 2m":         {verb: "retry-after", delay: 2 * time.Minute},
		"retry-after 1h rate 42": {verb: "retry-after", delay: time.Hour, reason: "rate 42"},
		"snooze":                 {bad: "snooze"},
		"snooze -1s":             {bad: "snooze -1s"},
		"snooze 1s extra":        {bad: "snooze 1s extra"},
		"retry-after soon":       {bad: "retry-after soon"},
		"frobnicate 1s":          {bad: "frobnicate 1s"},
	} {
		require.Equal(t, want, parseControl(line), line)
	}
}

// A command stopped by its timeout loses every process of its group, also
// a child that ignores SIGTERM and outlives sh: SIGKILL follows the grace
// whether or not sh is gone. Before, sh's exit counted as the group's, and
// the child ran on (here it would sleep 60 s).
func TestExecKillsTheGroupNotJustTheShell(t *testing.T) {
	for _, redirect := range []string{"", " >/dev/null 2>&1"} {
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "pid")
		cmd := fmt.Sprintf(`sh -c 'trap "" TERM; exec sleep 60'%s & echo $! > %s; wait`, redirect, pidFile)
		var out bytes.Buffer
		h := &Handler{Command: cmd, Env: []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out, Procs: NewProcGroups(), Grace: 300 * time.Millisecond}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := h.Handle(ctx, nil, &queue.Job{ID: 1, Kind: "k", Queue: "q", Attempt: 1, MaxAttempts: 1})
		cancel()
		require.ErrorContains(t, err, "command killed", "the child ignored SIGTERM")
		b, rerr := os.ReadFile(pidFile)
		require.NoError(t, rerr)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, perr)
		require.Eventually(t, func() bool { return processGone(pid) }, 5*time.Second, 20*time.Millisecond,
			"the child %d that ignored SIGTERM is gone (redirect %q)", pid, redirect)
	}
}

// processGone reports whether pid no longer runs (gone, or a zombie no one
// has reaped yet).
func processGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // "pid (comm) STATE ...": comm may hold spaces
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}
