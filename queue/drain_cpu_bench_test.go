package queue_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/queue"
)

// BenchmarkDrainCPU drains b.N pre-inserted jobs with a no-op handler
// (default config) and splits the cost at the first handler's start: the
// start (milliseconds from Run to the first handler, and the server's CPU
// meanwhile), then per job after it the CPU of the PostgreSQL server
// (every process of the cluster, the exited ones through their parent) and
// of this process. CPU per job is what a drain on a 2-core machine that
// runs both is bound by; it moves less with a shared machine's load than
// jobs/s. The server's CPU is read from /proc, so it is reported only when
// the server runs on this machine; run with TEST_DATABASE_URL pointing at
// a cluster of its own (fsync on, as pgwake bench has it) and a fixed
// count: -benchtime 20000x (docs/benchmarks.md, "Drain cost attribution").
func BenchmarkDrainCPU(b *testing.B) {
	ctx := context.Background()
	var done, first atomic.Int64
	var atFirst cpuSample
	all := make(chan struct{})
	n := int64(b.N)
	c := benchClient(b, queue.Config{
		Queues: map[string]queue.QueueConfig{"bench": {}},
		Handlers: map[string]queue.Handler{"bench": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			if first.CompareAndSwap(0, time.Now().UnixNano()) {
				atFirst = sampleCPU()
			}
			if done.Add(1) == n {
				close(all)
			}
			return nil
		})},
	})
	jobs := make([]queue.NewJob, b.N)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: "bench", Kind: "bench", Payload: benchPayload}
	}
	if _, err := c.EnqueueMany(ctx, jobs); err != nil {
		b.Fatal(err)
	}
	var pid int
	if err := c.Pool().QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	cpuServer = postmasterOf(pid)
	time.Sleep(200 * time.Millisecond) // the insert's after-work (WAL writer, hint bits) out of the way
	b.ResetTimer()
	start, t0 := sampleCPU(), time.Now()
	runUntilAll(ctx, b, c, all, &done)
	end := sampleCPU()
	f := time.Unix(0, first.Load())
	b.ReportMetric(float64(f.Sub(t0).Microseconds())/1000, "ms_to_first")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	b.ReportMetric(float64(b.N)/(b.Elapsed()-f.Sub(t0)).Seconds(), "jobs/s_after_first")
	if cpuServer > 0 {
		b.ReportMetric((atFirst.server-start.server)*1000, "server_ms_start")
		b.ReportMetric((end.server-atFirst.server)*1e6/float64(b.N), "server_us/job")
	}
	b.ReportMetric((end.client-atFirst.client)*1e6/float64(b.N), "client_us/job")
}

// cpuServer is the postmaster's pid when the server runs on this machine.
var cpuServer int

// cpuSample is CPU seconds used so far by the server and by this process.
type cpuSample struct{ server, client float64 }

// postmasterOf returns the parent of backend pid, 0 if /proc does not have it.
func postmasterOf(pid int) int {
	f := procStat(strconv.Itoa(pid))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// procStat returns the fields of /proc/pid/stat after the command name
// (state first), nil if unreadable.
func procStat(pid string) []string {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil
	}
	s := string(data)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

// sampleCPU reads the server's CPU (the postmaster with its reaped children,
// and each live child) and this process's.
func sampleCPU() cpuSample {
	var s cpuSample
	ticks := func(f []string, from, to int) (t float64) {
		for i := from; i <= to && i < len(f); i++ {
			v, _ := strconv.ParseFloat(f[i], 64)
			t += v
		}
		return t
	}
	if pm := strconv.Itoa(cpuServer); cpuServer > 0 {
		s.server = ticks(procStat(pm), 11, 14) // utime, stime, cutime, cstime
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			if f := procStat(e.Name()); len(f) > 12 && f[1] == pm {
				s.server += ticks(f, 11, 12)
			}
		}
		s.server /= 100 // USER_HZ
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	s.client = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	return s
}
