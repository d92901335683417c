package bench

import (
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"
)

// memSampler records the process's peak resident set size and Go heap
// while a drain runs.
type memSampler struct {
	quit chan struct{}
	wg   sync.WaitGroup
	rss  uint64
	heap uint64
}

func startMemSampler() *memSampler {
	m := &memSampler{quit: make(chan struct{})}
	m.sample()
	m.wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.quit:
				return
			case <-t.C:
				m.sample()
			}
		}
	})
	return m
}

func (m *memSampler) sample() {
	if r := residentBytes(); r > m.rss {
		m.rss = r
	}
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		if h := s[0].Value.Uint64(); h > m.heap {
			m.heap = h
		}
	}
}

// stop ends sampling and returns the peaks in MiB. The RSS is NaN-free: 0
// where /proc is missing.
func (m *memSampler) stop() (rssMiB, heapMiB float64) {
	close(m.quit)
	m.wg.Wait()
	m.sample()
	return float64(m.rss) / (1 << 20), float64(m.heap) / (1 << 20)
}

// residentBytes reads the resident set size from /proc/self/statm (Linux);
// 0 elsewhere.
func residentBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}
