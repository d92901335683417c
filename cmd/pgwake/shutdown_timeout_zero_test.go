package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// --shutdown-timeout 0 gives running commands no time, as --term-grace 0
// gives them no grace. Before, queue.Config read the 0 as "the default" and
// a worker told not to wait waited 10s for them.
func TestWorkerShutdownTimeoutZeroStopsAtOnce(t *testing.T) {
	schema := migrated(t)
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	id := enqueueID(t, "", "--schema", schema, "--kind", "stuck")
	w := startPgwake(t, "worker", "--schema", schema, "--metrics-addr", "off", "--shutdown-timeout", "0", "--term-grace", "0",
		"--handler", fmt.Sprintf(`stuck=exec:touch %s; sleep 600`, started))
	waitFor(t, "the handler to start", func() bool { _, err := os.Stat(started); return err == nil })
	t0 := time.Now()
	w.signal(syscall.SIGTERM)
	require.Equal(t, 0, w.wait())
	took := time.Since(t0)
	t.Logf("exit after %v", took)
	require.Less(t, took, 8*time.Second) // generous: the default it used was 10 s
	j := getJob(t, schema, id)
	require.Equal(t, "pending", j.state)
	require.Equal(t, 1, j.attempts)
}
