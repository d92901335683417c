package streambench_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/bench"
	"github.com/pgwake/pgwake/internal/bench/streambench"
	"github.com/pgwake/pgwake/internal/natstest"
	"github.com/pgwake/pgwake/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The stream mode at a tiny size: every drain event reaches JetStream, the
// capacity stream stores every event of the table (or the mode fails), and
// the figures are filled in.
func TestStreamModeForwardsEveryEvent(t *testing.T) {
	natstest.KeepJetStream(t)
	var out, log bytes.Buffer
	results, err := bench.Run(context.Background(), bench.Options{
		DatabaseURL: pgtest.URL(),
		Modes:       []bench.Mode{bench.ModeStream},
		Sizes:       bench.Sizes{StreamJobs: 300, BatchSize: 100},
		Out:         &out, Log: &log,
		Stream: streambench.Mode(natstest.URL()),
	}, &bench.Pgwake{})
	require.NoError(t, err, "log:\n%s", log.String())
	require.Len(t, results, 1)
	r := results[0]
	require.Equal(t, bench.ModeStream, r.Mode)
	require.Zero(t, r.Missing)
	require.Equal(t, float64(600), r.Extra["events"]) // enqueued + succeeded per job
	require.Positive(t, r.P99)
	require.Positive(t, r.Extra["forward_events_per_sec"])
	require.Positive(t, r.Extra["queue_events_per_sec"])
	require.Contains(t, out.String(), "capacity_ratio=")
}
