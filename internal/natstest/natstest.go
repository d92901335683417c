// Package natstest holds what tests that use the local NATS server share.
package natstest

import (
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// URL is $PGWAKE_TEST_NATS_URL or the local server.
func URL() string {
	if u := os.Getenv("PGWAKE_TEST_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// anchor is a stream that tests create and never delete.
const anchor = "PGWAKE_TEST_ANCHOR"

var (
	anchorOnce sync.Once
	anchorErr  error
)

// KeepJetStream makes sure the server keeps at least one stream while tests
// create and delete theirs. nats-server removes an account's store
// directory when its last stream is deleted; a stream that a test in another
// package (another process) creates at that moment fails with "could not
// create storage directory". With this stream never deleted, the count never
// reaches zero. Call it before creating a stream.
func KeepJetStream(tb testing.TB) {
	tb.Helper()
	anchorOnce.Do(func() { anchorErr = addAnchor() })
	if anchorErr != nil {
		tb.Fatalf("natstest: anchor stream: %v", anchorErr)
	}
}

func addAnchor() error {
	nc, err := nats.Connect(URL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		return err
	}
	// Creating it can itself meet another process's last delete: retry.
	for attempt := 0; ; attempt++ {
		_, err = js.AddStream(&nats.StreamConfig{Name: anchor, Subjects: []string{"pgwake_test_anchor"}, MaxMsgs: 1})
		if err == nil || errors.Is(err, nats.ErrStreamNameAlreadyInUse) || attempt == 10 {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
