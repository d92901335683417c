package main

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/queue"
)

// FuzzPeriodicFlag feeds arbitrary --periodic values to its parser: a usage
// error, or schedules that queue.New accepts; never a panic.
func FuzzPeriodicFlag(f *testing.F) {
	f.Add(`@every 200ms tick {"a":1}`)
	f.Add(`0 6 * * * report {"daily":true}`)
	f.Add(`*/5 * * * * * k [1,2]`)
	f.Add(`CRON_TZ=Europe/Paris 0 9 * * 1-5 standup`)
	f.Add(`@hourly k {`)
	f.Add(`tick`)
	f.Add(`@every -1s k`)
	f.Add("@daily k\x00")
	pool, err := pgxpool.New(f.Context(), "postgres://nobody@127.0.0.1:1/none") // never connects: New does not touch the database
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(pool.Close)
	f.Fuzz(func(t *testing.T, flag string) {
		ps, err := parsePeriodic([]string{flag}, "default", false)
		if err != nil {
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Fatalf("parsePeriodic(%q): not a usage error: %v", flag, err)
			}
			return
		}
		if _, err := queue.New(pool, queue.Config{Periodic: ps}); err != nil {
			t.Fatalf("parsePeriodic(%q) = %+v, which New refuses: %v", flag, ps, err)
		}
	})
}
