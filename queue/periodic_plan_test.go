package queue

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// planSlots without a database: slots ahead, lateness that is not a miss,
// missed slots collapsed to the latest (or skipped), cron walks.
func TestPlanSlots(t *testing.T) {
	t.Parallel()
	every, err := parseSchedule("@every 200ms")
	require.NoError(t, err)
	base := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	ptr := func(t time.Time) *time.Time { return &t }

	// New schedule: every slot within the lead, none in the past.
	p := planSlots(every, nil, at(50), false)
	require.Equal(t, []time.Time{at(200), at(400), at(600), at(800), at(1000)}, p.enqueue)
	require.Equal(t, at(1000), p.newLast)

	// Enqueued up to 1000 ms; at 500 ms only 1200 ms and 1400 ms are new.
	p = planSlots(every, ptr(at(1000)), at(500), false)
	require.Equal(t, []time.Time{at(1200), at(1400)}, p.enqueue)

	// Nothing new within the lead: wait until the next slot enters it.
	p = planSlots(every, ptr(at(1400)), at(390), false)
	require.True(t, p.newLast.IsZero())
	require.Equal(t, 210*time.Millisecond, p.wait) // 1600 ms enters the lead at 600 ms

	// Everything stopped after 1000 ms; at 5050 ms slots 1200..5000 were
	// missed: the latest runs once (or none with skip), then the lead.
	p = planSlots(every, ptr(at(1000)), at(5050), false)
	require.Equal(t, at(5000), p.enqueue[0])
	require.Equal(t, 19, p.skipped)
	require.Equal(t, at(6000), p.newLast)
	p = planSlots(every, ptr(at(1000)), at(5050), true)
	require.Equal(t, at(5200), p.enqueue[0])
	require.Equal(t, 20, p.skipped)

	// Cron: every minute; down for 10 minutes.
	cron, err := parseSchedule("* * * * *")
	require.NoError(t, err)
	p = planSlots(cron, ptr(base), base.Add(10*time.Minute+30*time.Second), false)
	require.Equal(t, []time.Time{base.Add(10 * time.Minute)}, p.enqueue)
	require.Equal(t, 9, p.skipped)
	require.Equal(t, 29*time.Second, planSlots(cron, ptr(base.Add(10*time.Minute)), base.Add(10*time.Minute+30*time.Second), false).wait)
}

// A schedule in a zone with daylight saving time follows the wall clock
// (robfig/cron's behaviour): a local time the spring change skips does not
// run that day, and one the autumn change repeats runs twice. docs/periodic.md
// says so.
func TestPeriodicSlotsAcrossDST(t *testing.T) {
	s, err := parseSchedule("CRON_TZ=Europe/Paris 30 2 * * *")
	require.NoError(t, err)
	slots := func(from string, hours int) int {
		at, err := time.Parse(time.RFC3339, from)
		require.NoError(t, err)
		end, n := at.Add(time.Duration(hours)*time.Hour), 0
		for next := s.next(at); !next.IsZero() && !next.After(end); next = s.next(next) {
			n++
		}
		return n
	}
	require.Equal(t, 3, slots("2026-03-01T00:00:00Z", 72), "three ordinary days")
	require.Equal(t, 2, slots("2026-03-28T00:00:00Z", 72), "02:30 does not exist on 29 March in Paris")
	require.Equal(t, 4, slots("2026-10-24T00:00:00Z", 72), "02:30 happens twice on 25 October in Paris")
}

// After an outage of weeks, a per-second cron schedule enqueues its latest
// missed slot once (none with SkipMissed) and then only slots to come: the
// forward walk over missed slots stopped at its cap 12 days back, and the
// 64 slots after the cap were enqueued as if due, tick after tick.
func TestLongOutageEnqueuesOneMissedSlot(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"* * * * * *", "*/5 * * * * *", "0 0 1 * *"} {
		s, err := parseSchedule(spec)
		require.NoError(t, err)
		now := time.Date(2026, 6, 1, 12, 0, 0, 500_000_000, time.UTC)
		for _, skip := range []bool{false, true} {
			last := now.Add(-90 * 24 * time.Hour).Truncate(time.Second)
			past := 0
			for range 10 {
				p := planSlots(s, &last, now, skip)
				if p.newLast.IsZero() {
					break
				}
				for _, sl := range p.enqueue {
					require.False(t, sl.After(now.Add(periodicLead)), "%s: slot %s beyond the lead", spec, sl)
					if !sl.After(now) {
						past++
					}
				}
				last = p.newLast
			}
			want := 1
			if skip {
				want = 0
			}
			require.Equal(t, want, past, "%s, SkipMissed %v: missed slots enqueued", spec, skip)
		}
	}
}
