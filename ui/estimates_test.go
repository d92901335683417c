package ui_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// The overview's note says counts above the exact limit are the planner's
// estimate "shown as ~N": the page as served (before or without the live
// stream) marks them too, as the live counters do (app.js fmtNum).
func TestOverviewMarksEstimatesAsServed(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{ExactLimit: 5})
	ctx := context.Background()
	jobs := make([]queue.NewJob, 20)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: "big", Kind: "k"}
	}
	_, err := b.client.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	st, err := b.client.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: 5})
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.Contains(t, st[0].Estimated, "pending", "the pending count is an estimate")
	_, body := get(t, nil, b.url+"/")
	m := regexp.MustCompile(`data-field="pending">([^<]*)<`).FindStringSubmatch(body)
	require.NotNil(t, m)
	require.Equal(t, "~"+strconv.FormatInt(st[0].Pending, 10), m[1], "an estimate is shown as ~N")
}
