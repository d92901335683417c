package events_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// Two databases of one cluster, each with pgwake in a schema of the same
// name and a stream on the default slot name ("<schema>_events"): slots
// are the cluster's, so the second stream must not take the first's slot
// (it ends with a permanent ErrSlot naming the other database), and a
// DropSlot run against the second database must not drop the first
// database's slot (and end its running stream) either.
func TestSlotOfAnotherDatabaseIsLeftAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Pool(t)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	db2 := "probem_db2_" + suffix
	_, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db2}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{db2}.Sanitize()+" WITH (FORCE)")
	})
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	u.Path = "/" + db2
	pool2 := pgtest.PoolOn(t, u.String(), nil)

	schema := "probem_" + suffix
	slot := schema + "_events"
	_, err = migrations.Up(ctx, admin, schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = events.DropSlot(context.Background(), admin, slot, true)
		_ = events.DropPublication(context.Background(), admin, slot)
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	_, err = migrations.Up(ctx, pool2, schema)
	require.NoError(t, err)

	pub := events.NewGoChannel(watermill.NopLogger{})
	s1, err := events.New(admin, events.Config{Schema: schema, Publisher: pub, MaxBackoff: time.Second})
	require.NoError(t, err)
	require.Equal(t, slot, s1.Slot())
	run1 := make(chan error, 1)
	ctx1, cancel1 := context.WithCancel(ctx)
	defer cancel1()
	go func() { run1 <- s1.Run(ctx1) }()
	pgtest.WaitFor(t, 30*time.Second, "the first database's stream streams", func() bool { return s1.Sessions() > 0 })

	s2, err := events.New(pool2, events.Config{Schema: schema, Publisher: pub, MaxBackoff: time.Second})
	require.NoError(t, err)
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	err = s2.Run(rctx)
	require.ErrorIs(t, err, events.ErrSlot, "the second database's stream on the first's slot")
	require.True(t, events.IsPermanent(err), "%v", err)

	// An operator of the second database drops "its" slot.
	err = events.DropSlot(ctx, pool2, slot, true)
	require.ErrorIs(t, err, events.ErrSlot, "DropSlot from the second database dropped the first database's slot")
	select {
	case err := <-run1:
		t.Fatalf("the first database's stream ended: %v", err)
	case <-time.After(2 * time.Second):
	}
	infos, err := events.Slots(ctx, admin)
	require.NoError(t, err)
	found := false
	for _, si := range infos {
		found = found || si.Name == slot
	}
	require.True(t, found, "the first database's slot is gone")
	cancel1()
	require.NoError(t, <-run1)
}

// Two pgwake schemas in one database, each with a stream on its default
// slot and publication ("<schema>_events"), event ids overlapping: each
// stream delivers its own schema's events, all of them, and none of the
// other's.
func TestTwoSchemasStreamsKeptApart(t *testing.T) {
	t.Parallel()
	type side struct {
		e    *env
		col  *eventstest.Collector
		ps   interface{ Close() error }
		stop func()
	}
	var sides []side
	for range 2 {
		e := newEnv(t)
		e.Slot, e.Pub = e.Schema+"_events", e.Schema+"_events" // the defaults, dropped at cleanup
		ps, col := channelSink(t)
		cfg := e.Config(ps)
		cfg.Slot, cfg.Publication = "", ""
		s, stop := e.RunStream(cfg)
		require.Equal(t, e.Slot, s.Slot())
		sides = append(sides, side{e, col, ps, stop})
	}
	for i, sd := range sides {
		c := sd.e.QueueClient(2)
		jobs := make([]queue.NewJob, 50+25*i)
		for j := range jobs {
			jobs[j] = queue.NewJob{Kind: "ok"}
		}
		_, err := c.EnqueueMany(context.Background(), jobs)
		require.NoError(t, err)
		stop := sd.e.RunQueue(c)
		waitFor(t, 60*time.Second, "jobs finished", func() bool { return sd.e.PendingJobs() == 0 })
		stop()
	}
	for _, sd := range sides {
		table := sd.e.WaitDelivered(sd.col, 60*time.Second)
		time.Sleep(500 * time.Millisecond) // room for a stray event of the other schema
		got := sd.col.Snapshot()
		checkDelivery(t, got, table)
		require.Len(t, got, len(table), "schema %s: deliveries", sd.e.Schema)
	}
	for _, sd := range sides {
		sd.stop()
		require.NoError(t, sd.ps.Close())
		<-sd.col.Done
	}
}
