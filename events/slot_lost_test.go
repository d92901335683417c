package events

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A slot the server invalidated (wal_status lost, past
// max_slot_wal_keep_size) ends the stream with a permanent ErrSlot that
// says what to do, whether the slot's row says so at start or the server's
// refusal to read it does: before, Run reconnected for ever. (Checked on
// the row and on the server's error as PostgreSQL 15 words it; making a
// slot lose its WAL needs a cluster-wide max_slot_wal_keep_size that
// would threaten the other tests' slots.)
func TestInvalidatedSlotStopsTheStream(t *testing.T) {
	err := checkSlot(&SlotInfo{Name: "s", Plugin: "pgoutput", Database: "d", WALStatus: "lost"}, "d")
	require.True(t, IsPermanent(err))
	require.ErrorIs(t, err, ErrSlot)
	require.Contains(t, err.Error(), "drop it")
	require.NoError(t, checkSlot(&SlotInfo{Name: "s", Plugin: "pgoutput", Database: "d", WALStatus: "unreserved"}, "d"))

	server := &pgconn.PgError{Code: "55000", Message: `cannot read from logical replication slot "orders"`,
		Detail: "This slot has been invalidated because it exceeded the maximum reserved size."}
	err = classify(fmt.Errorf("events: start replication: %w", server), "u")
	require.True(t, IsPermanent(err))
	require.ErrorIs(t, err, ErrSlot)
	require.Contains(t, err.Error(), `slot "orders"`)
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe), "the server's error is kept")
}
