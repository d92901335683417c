package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A command that ignores SIGTERM and left a grandchild that ignores it
// too: the worker exits --shutdown-timeout plus --term-grace after the
// signal (not --shutdown-timeout), having killed the whole group. An
// orchestrator's grace period must cover both (docs/operations.md).
func TestWorkerShutdownTakesTheTimeoutPlusTheTermGrace(t *testing.T) {
	schema := migrated(t)
	dir := t.TempDir()
	started, pidFile := filepath.Join(dir, "started"), filepath.Join(dir, "pid")
	id := enqueueID(t, "", "--schema", schema, "--kind", "stuck")
	w := startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "off", "--shutdown-timeout", "1s", "--term-grace", "1s",
		"--handler", fmt.Sprintf(`stuck=exec:trap '' TERM; (trap '' TERM; sleep 600) & echo $! > %s; touch %s; sleep 600; wait`, pidFile, started))
	waitFor(t, "the handler to start", func() bool { _, err := os.Stat(started); return err == nil })
	t0 := time.Now()
	w.signal(syscall.SIGTERM)
	require.Equal(t, 0, w.wait())
	took := time.Since(t0)
	t.Logf("exit after %v", took)
	require.GreaterOrEqual(t, took, 2*time.Second)
	require.Less(t, took, 8*time.Second) // generous on a loaded machine; the sum is 2 s
	pb, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(pb)))
	require.NoError(t, err)
	waitFor(t, "grandchild gone", func() bool { return processGone(pid) })
	j := getJob(t, schema, id)
	require.Equal(t, "pending", j.state)
	require.Equal(t, 1, j.attempts)
	require.Contains(t, j.lastError, "killed")
}
