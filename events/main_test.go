package events_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgwake/pgwake/events"
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

// channelSink is an in-process Go channel Pub/Sub for a stream to publish
// to, and a collector of what arrives on its "pgwake.events" topic.
func channelSink(t *testing.T) (*gochannel.GoChannel, *eventstest.Collector) {
	t.Helper()
	ps := events.NewGoChannel(nil)
	sub, err := ps.Subscribe(context.Background(), "pgwake.events")
	require.NoError(t, err)
	return ps, collect(t, sub)
}

// fuzzWorker reports whether this process is a `go test -fuzz` worker.
func fuzzWorker() bool {
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.fuzzworker") {
			return true
		}
	}
	return false
}
