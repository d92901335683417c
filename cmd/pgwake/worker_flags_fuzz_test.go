package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgwake/pgwake/queue"
)

// FuzzWorkerFlags feeds arbitrary --handler and --kind-timeout values to the
// worker's flag parsers: they return a usage error or values the queue
// accepts (a valid kind, a non-empty command, a timeout that is positive or
// -1 for none), never panic.
func FuzzWorkerFlags(f *testing.F) {
	f.Add("email=exec:./send.sh", "email=30s")
	f.Add("resize=exec:convert", "resize=-1s")
	f.Add("a=exec: ", "a=0")
	f.Add("=exec:x", "=1m")
	f.Add("k=exec:x", "k=1h2m3.5s")
	f.Add("k=exec:x", "k=9999999999999h")
	f.Add("k x=exec:y", "k=abc")
	f.Add("k\x00=exec:y", "other=1s")
	f.Fuzz(func(t *testing.T, handler, timeout string) {
		hs, err := parseHandlers([]string{handler})
		if err != nil {
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Fatalf("parseHandlers(%q): not a usage error: %v", handler, err)
			}
			return
		}
		for kind, cmd := range hs {
			if queue.ValidateKind(kind) != nil || strings.TrimSpace(cmd) == "" {
				t.Fatalf("parseHandlers(%q) accepted kind %q command %q", handler, kind, cmd)
			}
		}
		ts, err := parseKindTimeouts([]string{timeout}, hs)
		if err != nil {
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Fatalf("parseKindTimeouts(%q): not a usage error: %v", timeout, err)
			}
			return
		}
		for kind, d := range ts {
			if _, ok := hs[kind]; !ok {
				t.Fatalf("timeout for kind %q without a handler", kind)
			}
			if d != -1 && d <= 0 {
				t.Fatalf("parseKindTimeouts(%q) = %s", timeout, d)
			}
		}
	})
}
