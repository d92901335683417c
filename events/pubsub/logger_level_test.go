package pubsub

import (
	"bytes"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// The queue logs one debug entry per delivered message; an adapter known
// to drop debug logs does not get them encoded (BenchmarkDrain's profile),
// one that shows them still gets them, and info and warnings always arrive.
func TestZapForSkipsDroppedDebugLogs(t *testing.T) {
	t.Parallel()
	var quiet, loud bytes.Buffer
	q := zapFor(watermill.NewStdLoggerWithOut(&quiet, false, false))
	l := zapFor(watermill.NewStdLoggerWithOut(&loud, true, false))
	require.Nil(t, q.Check(zap.DebugLevel, "job succeeded"))
	require.NotNil(t, l.Check(zap.DebugLevel, "job succeeded"))
	require.Nil(t, zapFor(watermill.NopLogger{}).Check(zap.ErrorLevel, "x"))

	for _, z := range []*zap.Logger{q, l} {
		z = z.Named("worker").With(zap.String("queue", "q"))
		z.Debug("job succeeded", zap.Int64("job_id", 1))
		z.Info("workers starting")
		z.Warn("claim failed", zap.Error(ErrNacked))
	}
	require.NotContains(t, quiet.String(), "job succeeded")
	require.Contains(t, loud.String(), "job succeeded")
	for _, out := range []string{quiet.String(), loud.String()} {
		require.Contains(t, out, "worker: workers starting")
		require.Contains(t, out, "worker: claim failed")
		require.Contains(t, out, "level=warn")
		require.Contains(t, out, "queue=q")
	}
}
