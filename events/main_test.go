package events_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	if fuzzWorker() {
		// Fuzz targets need no database: do not start a cluster per worker.
		os.Exit(m.Run())
	}
	code := pgtest.Run(m)
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill/pubsub/gochannel.(*GoChannel).Subscribe.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

type env = eventstest.Env

var (
	newEnv        = eventstest.NewEnv
	newEnvOn      = eventstest.NewEnvOn
	collect       = eventstest.Collect
	checkDelivery = eventstest.CheckDelivery
	waitFor       = eventstest.WaitFor
)

// fuzzWorker reports whether this process is a `go test -fuzz` worker.
func fuzzWorker() bool {
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.fuzzworker") {
			return true
		}
	}
	return false
}
