package migrations_test

import (
	"testing"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
)

// FuzzValidateSchema: every schema name that passes validation is a plain
// identifier, and every name pgwake derives from it (the wake channel, the
// default replication slot and publication) is valid too, so no derived name
// can be truncated by PostgreSQL or need quoting.
func FuzzValidateSchema(f *testing.F) {
	for _, s := range []string{"pgwake", "", "a", "_x", "1x", "Pgwake", `x"; DROP SCHEMA pgwake; --`, "x'y", "a.b", "a\x00",
		"s234567890123456789012345678901234567890", "s2345678901234567890123456789012345678901", "ünï"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if migrations.ValidateSchema(s) != nil {
			return
		}
		if len(s) > migrations.MaxSchemaLen {
			t.Fatalf("accepted %d bytes", len(s))
		}
		if err := sqlident.Validate("schema", s, 0); err != nil {
			t.Fatalf("accepted %q that is not a plain identifier: %v", s, err)
		}
		if err := notify.ValidateChannel(queue.WakeChannel(s)); err != nil {
			t.Fatalf("schema %q: wake channel invalid: %v", s, err)
		}
		if err := events.ValidateSlotName(s + "_events"); err != nil {
			t.Fatalf("schema %q: default slot invalid: %v", s, err)
		}
	})
}
