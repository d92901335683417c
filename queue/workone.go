package queue

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// WorkOne claims one due job and runs it through its handler in the calling
// goroutine, recording its outcome as a worker would (success, retry,
// failure, snooze, cancel; held or leased mode), and returns the job's id;
// ok is false when no job was due. It looks at Config.Queues in name order
// (DefaultQueue when there are none) and ignores pauses. It does not need Run
// and must not be mixed with it: it is for tests (package pgwaketest) and
// tools that work a queue step by step.
func (c *Client) WorkOne(ctx context.Context) (id int64, ok bool, err error) {
	names := slices.Sorted(maps.Keys(c.cfg.Queues))
	if len(names) == 0 {
		names = []string{DefaultQueue}
	}
	for _, q := range names {
		b, _, err := c.claim(ctx, q, 1, 1, nil, false, "", nil)
		if err != nil {
			return 0, false, fmt.Errorf("queue: work one: %w", err)
		}
		if b == nil {
			continue
		}
		id = b.jobs[0].job.ID
		l := newQueueLoop(c, q, QueueConfig{MaxWorkers: 1})
		l.slots <- struct{}{} // the slot a dispatcher takes before it claims
		if b.leased {
			c.executeLeased(ctx, b, l)
			l.handlers.Wait()
		} else {
			c.execute(ctx, b, l)
			<-l.slots
		}
		return id, true, nil
	}
	return 0, false, nil
}
