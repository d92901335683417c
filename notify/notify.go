package notify

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgwake/pgwake/internal/backoff"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/floor"
	"github.com/pgwake/pgwake/internal/promreg"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// Event is what a subscriber receives: a notification on its channel, or a
// Resync after the listener (re)connected.
type Event struct {
	Channel string
	Payload string
	// Resync is true when the listener has just (re)connected: notifications
	// may have been missed, so the subscriber should check the database now.
	Resync bool
}

// Func receives events. It runs on the listener's goroutine and must return
// quickly (record the hint, signal a channel without blocking).
type Func func(Event)

// Config configures a Listener. The zero value is usable.
type Config struct {
	// ConnConfig is the connection to LISTEN on. Required. Behind PgBouncer in
	// transaction mode this must point at PostgreSQL directly (or at a session
	// pool): LISTEN needs a session.
	ConnConfig *pgx.ConnConfig
	// PingInterval is how long the connection may be idle before the listener
	// pings it. Default 15s; at least MinPingInterval.
	PingInterval time.Duration
	// PingTimeout bounds one ping. Default 5s; at least MinPingTimeout.
	PingTimeout time.Duration
	// MinBackoff is the first reconnect delay. Default 100ms; at least
	// MinMinBackoff, as MaxBackoff.
	MinBackoff time.Duration
	// MaxBackoff caps the reconnect delay. Default 5s.
	MaxBackoff time.Duration
	// ApplicationName names the LISTEN session in pg_stat_activity. Default
	// ApplicationName ("pgwake_listener").
	ApplicationName string
	// Logger receives connection state changes. Default zap.NewNop().
	Logger *zap.Logger
	// Registerer gets the listener's metrics. Default: none registered.
	Registerer prometheus.Registerer
}

// ApplicationName is the application_name of the LISTEN session.
const ApplicationName = "pgwake_listener"

// ErrNilConnConfig is returned by New when Config.ConnConfig is nil.
var ErrNilConnConfig = errors.New("notify: Config.ConnConfig is required")

// ErrInvalidConfig is wrapped by New's error for a duration below its
// floor: a PingInterval of a nanosecond pinged the server without pause,
// and tiny timeouts and backoffs reconnected without pause
// (TestTinyPingIntervalDoesNotSpin).
var ErrInvalidConfig = errors.New("notify: invalid config")

// Floors of Config's durations (zero or negative takes the default).
const (
	MinPingInterval = 10 * time.Millisecond
	MinPingTimeout  = 10 * time.Millisecond
	MinMinBackoff   = time.Millisecond // MinBackoff and MaxBackoff at least
)

// checkDurations refuses a duration set below its floor.
func (c Config) checkDurations() error {
	if err := floor.Check(floor.D{Name: "PingInterval", Value: c.PingInterval, Min: MinPingInterval},
		floor.D{Name: "PingTimeout", Value: c.PingTimeout, Min: MinPingTimeout},
		floor.D{Name: "MinBackoff", Value: c.MinBackoff, Min: MinMinBackoff},
		floor.D{Name: "MaxBackoff", Value: c.MaxBackoff, Min: MinMinBackoff}); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// Listener owns the LISTEN connection. Create it with New, start it with Run.
type Listener struct {
	cfg Config
	log *zap.Logger

	mu        sync.Mutex
	subs      map[string]map[*subscription]struct{}
	listening map[string]bool // channels LISTENed on the current connection
	// fresh are subscriptions not yet sent their Resync: one whose channel
	// another subscription already listens on gets it at the next sync.
	fresh     map[*subscription]struct{}
	changed   chan struct{} // poked when subscriptions change, interrupts the wait
	connected bool

	received   *prometheus.CounterVec
	reconnects prometheus.Counter
}

type subscription struct {
	channel string
	fn      Func
}

// New returns a Listener. It does not connect until Run.
func New(cfg Config) (*Listener, error) {
	if cfg.ConnConfig == nil {
		return nil, ErrNilConnConfig
	}
	cfg.ConnConfig = cfg.ConnConfig.Copy()
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	// Name the session so operators (and tests) can find it in pg_stat_activity.
	if cfg.ApplicationName == "" {
		cfg.ApplicationName = ApplicationName
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = cfg.ApplicationName
	if err := cfg.checkDurations(); err != nil {
		return nil, err
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = 15 * time.Second
	}
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = 5 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = cfg.MinBackoff
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	l := &Listener{
		cfg:       cfg,
		log:       cfg.Logger.Named("listener"),
		subs:      map[string]map[*subscription]struct{}{},
		listening: map[string]bool{},
		fresh:     map[*subscription]struct{}{},
		changed:   make(chan struct{}, 1),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_notify_notifications_total",
			Help: "Notifications received on the LISTEN connection, by channel.",
		}, []string{"channel"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pgwake_notify_reconnects_total",
			Help: "Times the LISTEN connection was re-established after being lost.",
		}),
	}
	if cfg.Registerer != nil {
		// A registry may already hold these from an earlier listener of the
		// process (a Client whose Run is called again): keep counting there.
		var err error
		if l.received, err = promreg.Register(cfg.Registerer, l.received); err != nil {
			return nil, fmt.Errorf("notify: register metrics: %w", err)
		}
		if l.reconnects, err = promreg.Register(cfg.Registerer, l.reconnects); err != nil {
			return nil, fmt.Errorf("notify: register metrics: %w", err)
		}
	}
	return l, nil
}

// ValidateChannel checks a channel name: a plain identifier of at most 63 bytes.
func ValidateChannel(channel string) error {
	return sqlident.Validate("channel", channel, 0)
}

// Subscribe registers fn for notifications on channel and returns a function
// that removes it. If the listener is connected, fn soon receives a Resync
// event once the channel is LISTENed on, also when another subscription
// already listens on it (TestSecondSubscriberGetsItsResync).
func (l *Listener) Subscribe(channel string, fn Func) (unsubscribe func(), err error) {
	if err := ValidateChannel(channel); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, errors.New("notify: nil Func")
	}
	s := &subscription{channel: channel, fn: fn}
	l.mu.Lock()
	if l.subs[channel] == nil {
		l.subs[channel] = map[*subscription]struct{}{}
	}
	l.subs[channel][s] = struct{}{}
	l.fresh[s] = struct{}{}
	l.mu.Unlock()
	l.poke()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.subs[channel], s)
			delete(l.fresh, s)
			if len(l.subs[channel]) == 0 {
				delete(l.subs, channel)
			}
			l.mu.Unlock()
			l.poke()
		})
	}, nil
}

// Connected reports whether the LISTEN connection is up.
func (l *Listener) Connected() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.connected
}

func (l *Listener) poke() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// Run connects and delivers notifications until ctx is done. It returns nil
// after ctx is cancelled; connection failures are retried, not returned.
func (l *Listener) Run(ctx context.Context) error {
	wait := backoff.Backoff{Min: l.cfg.MinBackoff, Max: l.cfg.MaxBackoff}
	first := true
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, l.cfg.ConnConfig)
		if err == nil {
			if !first {
				l.reconnects.Inc()
			}
			l.log.Info("listener connected", zap.Bool("reconnect", !first))
			first = false
			began := time.Now()
			err = l.serve(ctx, conn)
			if time.Since(began) >= l.cfg.MaxBackoff {
				// A connection that held starts the backoff over; one
				// lost at once (a pooler or a script that ends it, a
				// LISTEN refused) goes on doubling it, as a refused
				// connect does, instead of reconnecting every MinBackoff.
				wait.Reset()
			}
			l.setConnected(false)
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			conn.Close(cctx) //nolint:errcheck // the connection is being discarded
			cancel()
		}
		if ctx.Err() != nil {
			break
		}
		d := wait.Next()
		l.log.Warn("listener connection lost, reconnecting", zap.Error(err), zap.Duration("backoff", d))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	return nil
}

func (l *Listener) setConnected(v bool) {
	l.mu.Lock()
	l.connected = v
	if !v {
		l.listening = map[string]bool{}
	}
	l.mu.Unlock()
}

// sync LISTENs/UNLISTENs so the connection matches the subscriptions, and
// returns the subscriptions that need a Resync (all of them on a fresh
// connection, new ones otherwise).
func (l *Listener) sync(ctx context.Context, conn *pgx.Conn) ([]*subscription, error) {
	l.mu.Lock()
	var add, drop []string
	for ch := range l.subs {
		if !l.listening[ch] {
			add = append(add, ch)
		}
	}
	for ch := range l.listening {
		if _, ok := l.subs[ch]; !ok {
			drop = append(drop, ch)
		}
	}
	l.mu.Unlock()
	for _, ch := range add {
		if _, err := conn.Exec(ctx, "LISTEN "+sqlident.Quote(ch)); err != nil {
			return nil, fmt.Errorf("listen %s: %w", ch, err)
		}
	}
	for _, ch := range drop {
		if _, err := conn.Exec(ctx, "UNLISTEN "+sqlident.Quote(ch)); err != nil {
			return nil, fmt.Errorf("unlisten %s: %w", ch, err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ch := range add {
		l.listening[ch] = true
	}
	for _, ch := range drop {
		delete(l.listening, ch)
	}
	var resync []*subscription
	for _, ch := range add {
		for s := range l.subs[ch] {
			resync = append(resync, s)
			delete(l.fresh, s)
		}
	}
	// New subscriptions to a channel already listened on
	// (TestSecondSubscriberGetsItsResync).
	for s := range l.fresh {
		if l.listening[s.channel] {
			resync = append(resync, s)
			delete(l.fresh, s)
		}
	}
	return resync, nil
}

func (l *Listener) serve(ctx context.Context, conn *pgx.Conn) error {
	l.setConnected(true)
	for {
		resync, err := l.sync(ctx, conn)
		if err != nil {
			return err
		}
		for _, s := range resync {
			s.fn(Event{Channel: s.channel, Resync: true})
		}
		// Wait until the subscriptions change (then LISTEN again), ctx is
		// done or the connection fails.
		sctx, scancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			select {
			case <-l.changed:
				scancel()
			case <-done:
			}
		}()
		err = l.wait(sctx, conn)
		close(done)
		scancel()
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// wait delivers notifications until sctx is done or the connection fails,
// pinging after every PingInterval without traffic.
func (l *Listener) wait(sctx context.Context, conn *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(sctx, l.cfg.PingInterval)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err == nil {
			l.deliver(n.Channel, n.Payload)
			continue
		}
		if sctx.Err() != nil {
			if conn.IsClosed() {
				return fmt.Errorf("wait for notification: %w", err)
			}
			return nil
		}
		if !errors.Is(err, context.DeadlineExceeded) || conn.IsClosed() {
			return fmt.Errorf("wait for notification: %w", err)
		}
		// Idle for PingInterval: make sure the connection is alive.
		pctx, pcancel := context.WithTimeout(sctx, l.cfg.PingTimeout)
		err = conn.Ping(pctx)
		pcancel()
		if err != nil {
			if sctx.Err() != nil && !conn.IsClosed() {
				return nil
			}
			return fmt.Errorf("ping: %w", err)
		}
	}
}

func (l *Listener) deliver(channel, payload string) {
	l.received.WithLabelValues(channel).Inc()
	l.mu.Lock()
	subs := make([]*subscription, 0, len(l.subs[channel]))
	for s := range l.subs[channel] {
		subs = append(subs, s)
	}
	l.mu.Unlock()
	for _, s := range subs {
		s.fn(Event{Channel: channel, Payload: payload})
	}
}
