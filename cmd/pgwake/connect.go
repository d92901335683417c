package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/queue"
)

// connectHint ends every connection error: what the user can do.
const connectHint = "set --database-url or " + envDatabaseURL + ", or run `make demo` to try pgwake on a throwaway database"

// resolveURL returns the database URL from --database-url,
// PGWAKE_DATABASE_URL or DATABASE_URL, in that order.
func (env *cliEnv) resolveURL() (string, error) {
	for _, u := range []string{env.databaseURL, os.Getenv(envDatabaseURL), os.Getenv(envFallbackURL)} {
		if u != "" {
			return u, nil
		}
	}
	return "", errors.New("no database given: " + connectHint)
}

// connect opens a pool on the command's database and checks that the server
// answers. Errors are one line: what failed, why, and what to do.
func (env *cliEnv) connect(ctx context.Context) (*pgxpool.Pool, error) {
	return env.connectWith(ctx, nil)
}

// connectSchema is connect, then checkSchema: for commands that need
// pgwake's tables to exist already. The caller closes the pool.
func (env *cliEnv) connectSchema(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := env.connect(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkSchema(ctx, pool, env.schema); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// connectClient connects and returns a queue client with no workers, for
// commands that enqueue or change jobs. The caller closes the pool.
func (env *cliEnv) connectClient(ctx context.Context) (*queue.Client, *pgxpool.Pool, error) {
	pool, err := env.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	client, err := queue.New(pool, queue.Config{Schema: env.schema, Logger: env.log})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return client, pool, nil
}

// connectWith is connect with a chance to adjust the pool config (e.g.
// MaxConns) before the pool is created.
func (env *cliEnv) connectWith(ctx context.Context, mutate func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	u, err := env.resolveURL()
	if err != nil {
		return nil, err
	}
	return openPool(ctx, u, mutate)
}

func openPool(ctx context.Context, u string, mutate func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		// pgx's parse errors quote the URL with the password masked already;
		// say only what is wrong.
		return nil, fmt.Errorf("invalid database URL %s: %s; expected postgres://user:password@host:port/database", redactURL(u), parseErrCause(err))
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "pgwake"
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if mutate != nil {
		mutate(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to PostgreSQL at %s: %s; %s", describeTarget(cfg), connectCause(err), connectHint)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("cannot connect to PostgreSQL at %s: %s; %s", describeTarget(cfg), connectCause(err), connectHint)
	}
	return pool, nil
}

// describeTarget names the server as host:port/database, never with the password.
func describeTarget(cfg *pgxpool.Config) string {
	cc := cfg.ConnConfig
	host := cc.Host
	if strings.HasPrefix(host, "/") {
		return fmt.Sprintf("socket %s/.s.PGSQL.%d (database %s)", host, cc.Port, cc.Database)
	}
	return fmt.Sprintf("%s/%s", net.JoinHostPort(host, fmt.Sprint(cc.Port)), cc.Database)
}

// connectCause reduces a pgx connect error to its root: "connection
// refused", "password authentication failed for user x", ...
func connectCause(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "cannot resolve host " + dnsErr.Name + ": " + dnsErr.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Err != nil {
		return opErr.Err.Error()
	}
	// The innermost error is the most specific.
	for {
		next := errors.Unwrap(err)
		if next == nil {
			break
		}
		err = next
	}
	return oneLine(err.Error())
}

func parseErrCause(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) && pe.Unwrap() != nil {
		return oneLine(pe.Unwrap().Error())
	}
	return oneLine(err.Error())
}

// redactURL replaces the password in a URL (or key=value DSN) with "xxxxx".
func redactURL(s string) string {
	if strings.Contains(s, "://") {
		if u, err := url.Parse(s); err == nil && u.Scheme != "" {
			if u.User != nil {
				if _, has := u.User.Password(); has {
					u.User = url.UserPassword(u.User.Username(), "xxxxx")
				}
			}
			// pgx also takes ?password=... (and ?sslpassword=...) in a URL.
			q := u.Query()
			changed := false
			for k := range q {
				if strings.Contains(strings.ToLower(k), "password") {
					q.Set(k, "xxxxx")
					changed = true
				}
			}
			if changed {
				u.RawQuery = q.Encode()
			}
			return u.Redacted() // also masks any password left
		}
		// Unparseable URL: drop the userinfo and any password parameter.
		if at := strings.LastIndex(s, "@"); at >= 0 {
			if p := strings.Index(s, "://"); p >= 0 && p < at {
				s = s[:p+3] + "xxxxx" + s[at:]
			}
		}
		return urlPasswordParam.ReplaceAllString(s, "${1}xxxxx")
	}
	// keyword/value form: password=..., password = '...', sslpassword=...,
	// a backslash-escaped space inside an unquoted value.
	return kvPassword.ReplaceAllString(s, "${1}xxxxx")
}

var (
	urlPasswordParam = regexp.MustCompile(`(?i)([?&][a-z_]*password=)[^&#]*`)
	kvPassword       = regexp.MustCompile(`(?is)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:\\.|[^\s\\])+\\?)`)
)
