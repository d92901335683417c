package events_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
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
	collect       = eventstest.Collect
	checkDelivery = eventstest.CheckDelivery
	waitFor       = eventstest.WaitFor
)
