package reliability

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWorkerProcessesKilled kills worker processes with SIGKILL at random
// moments while four of them work a stream of jobs (issue: 20 kills during
// 20,000 jobs; CI runs 8 kills during 4,000). Killed claim transactions roll
// back, so every job still ends with exactly one effect and, as no attempt
// is lost to anything but a kill, ok jobs take exactly one attempt.
func TestWorkerProcessesKilled(t *testing.T) {
	n, kills := size(4000, 20000), size(8, 20)
	const procs = 4
	w := newWorld(t, false)
	hold := "2ms"
	gen := 0
	start := func() *helper {
		gen++
		h, line := w.startHelper("worker", fmt.Sprintf("%s_%d", appWorker, gen), "PGWAKE_RELIABILITY_HOLD="+hold)
		require.Equal(t, "ready", line)
		return h
	}
	workers := make([]*helper, procs)
	for i := range workers {
		workers[i] = start()
	}
	prod := w.produce(w.url, n, 2, 3000)

	midTx := 0
	for k := 1; k <= kills; k++ {
		threshold := k * n / (kills + 1)
		deadline := time.Now().Add(3 * time.Minute)
		for w.succeededJobs() < threshold {
			require.True(t, time.Now().Before(deadline), "no progress to %d succeeded jobs", threshold)
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(rand.N(20 * time.Millisecond))
		v := rand.N(procs)
		// Transactions of the victim that have written (an effect, at
		// least) and not committed: the kill lands in their handlers.
		open := w.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND backend_xid IS NOT NULL`, workers[v].app)
		workers[v].kill()
		if open > 0 {
			midTx++
		}
		workers[v] = start()
	}
	prod.wait(hangGuard())
	w.waitAllFinal(n, hangGuard())
	for _, h := range workers {
		h.kill()
	}
	w.check(t.Name(), n, true, kills, prod, fmt.Sprintf("processes=%d kills_with_uncommitted_effects=%d", procs, midTx))
}
