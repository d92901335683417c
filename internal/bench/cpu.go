package bench

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// cpuSample is the machine's busy CPU time (every process: the system
// under test, PostgreSQL, the harness, and anything else running) and this
// process's own, at one moment. ok is false where /proc/stat cannot be
// read (not Linux).
type cpuSample struct {
	machine, process time.Duration
	ok               bool
}

// clockTick is USER_HZ, the unit of /proc/stat: 100 on every Linux
// architecture Go supports.
const clockTick = 100

func sampleCPU() cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.process = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 8 || string(f[0]) != "cpu" {
		return s
	}
	// user nice system idle iowait irq softirq: busy is all but idle and
	// iowait.
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, err := strconv.ParseInt(string(f[i]), 10, 64)
		if err != nil {
			return s
		}
		ticks += n
	}
	s.machine, s.ok = time.Duration(ticks)*time.Second/clockTick, true
	return s
}

// cpuStats adds to extra the CPU time per job between two samples:
// cpu_machine_us_per_job (every process on the machine, so only meaningful
// on an otherwise idle machine) and cpu_harness_us_per_job (this process:
// the harness, its producers and, for the Go systems, their workers).
func cpuStats(extra map[string]float64, a, b cpuSample, n int) {
	if !a.ok || !b.ok || n == 0 {
		return
	}
	extra["cpu_machine_us_per_job"] = float64((b.machine - a.machine).Microseconds()) / float64(n)
	extra["cpu_harness_us_per_job"] = float64((b.process - a.process).Microseconds()) / float64(n)
}
