package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// --retry-backoff's help says the delay doubles per attempt, capped at
// 24h; a first delay above the cap was taken as it was (48h, then 24h,
// 24h, ...). It is a usage error, before anything connects.
func TestRetryBackoffAboveItsCap(t *testing.T) {
	t.Parallel()
	r := pgwake(t, "", "worker", "--handler", "k=exec:true", "--metrics-addr", "off", "--retry-backoff", "48h")
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "--retry-backoff 48h0m0s is above the retries' cap of 24h0m0s")
}
