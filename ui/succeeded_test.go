package ui

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/queue"
)

// The counters' successes of the last minute are those of the whole
// seconds after one minute before now (59-60 s); a queue they alone name
// is listed, in name order; a second more than 61 s older than a newly
// counted one is forgotten.
func TestSucceededWindowIsTheLastMinutesWholeSeconds(t *testing.T) {
	h := newHub(Config{Logger: zap.NewNop()})
	now := time.Unix(1_000_000, 500_000_000)
	from := now.Add(-time.Minute).Unix() // 999,940
	h.countSucceeded(from-5, "a", 100)   // older than the window
	h.countSucceeded(from, "a", 10)      // partly in it: not counted
	h.countSucceeded(from+1, "a", 1)
	h.countSucceeded(now.Unix(), "a", 2)
	h.countSucceeded(now.Unix(), "b", 3)
	st := h.withSucceeded([]queue.QueueStat{{Queue: "c", Pending: 4}, {Queue: "a", Pending: 1}}, now)
	require.Equal(t, []queue.QueueStat{
		{Queue: "a", Pending: 1, SucceededLastMinute: 3},
		{Queue: "b", SucceededLastMinute: 3},
		{Queue: "c", Pending: 4},
	}, st)

	h.countSucceeded(now.Unix()+1, "a", 1) // from-5 is now more than 61 s older, from is 61
	require.NotContains(t, h.succ, from-5)
	require.Contains(t, h.succ, from)
}
