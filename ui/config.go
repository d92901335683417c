package ui

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
)

// Config configures a Handler.
type Config struct {
	// Client reads and acts on the queue. Required.
	Client *queue.Client
	// Listener is the process's LISTEN connection; Run subscribes to the
	// events channel on it. Required for live updates. The caller runs it.
	Listener *notify.Listener
	// Prefix is the path the handler is mounted at, e.g. "/pgwake" (no
	// trailing slash). Default "": the root.
	Prefix string
	// Token, when set, is required on every request: an
	// "Authorization: Bearer" header, or ?token= once (which sets an
	// HttpOnly, SameSite=Strict cookie). Default "": no token.
	Token string
	// ReadOnly hides the actions and refuses their POSTs. Default false.
	ReadOnly bool
	// ExactLimit is QueueStats's exact limit. Default queue.DefaultExactLimit.
	ExactLimit int
	// StatsMinInterval is the least time between two counter refreshes
	// pushed to pages while events flow. Default 100ms.
	StatsMinInterval time.Duration
	// RefreshInterval refreshes the counters (oldest age, a missed
	// notification) when no event came. Default 5s.
	RefreshInterval time.Duration
	// MaxStreams caps the live streams (open pages) served at once; one
	// more is refused with 503 and a Retry-After, and its page tries again
	// later. Default 100.
	MaxStreams int
	// PayloadLimit caps the bytes of a payload shown on a job page.
	// Default 64 KiB.
	PayloadLimit int
	// Logger receives warnings. Default zap.NewNop().
	Logger *zap.Logger
}

// ErrNoClient is returned by New when Config.Client is nil.
var ErrNoClient = errors.New("ui: Config.Client is required")

func (c Config) withDefaults() Config {
	if c.ExactLimit == 0 {
		c.ExactLimit = queue.DefaultExactLimit
	}
	if c.StatsMinInterval <= 0 {
		c.StatsMinInterval = 100 * time.Millisecond
	}
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = 5 * time.Second
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = 100
	}
	if c.PayloadLimit <= 0 {
		c.PayloadLimit = 64 << 10
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

func (c Config) validate() error {
	if c.Client == nil {
		return ErrNoClient
	}
	if c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/")) {
		return fmt.Errorf("ui: Prefix %q must start with / and not end with one", c.Prefix)
	}
	return nil
}
