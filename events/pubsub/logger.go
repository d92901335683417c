package pubsub

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ZapLogger returns a watermill.LoggerAdapter that writes to l: for callers
// that log with zap (as the rest of pgwake does) and configure the
// Publisher or Subscriber with it. Trace goes to zap's Debug. A nil l is
// zap.NewNop().
func ZapLogger(l *zap.Logger) watermill.LoggerAdapter {
	if l == nil {
		l = zap.NewNop()
	}
	return zapAdapter{l: l}
}

// zapAdapter is the watermill.LoggerAdapter of ZapLogger.
type zapAdapter struct{ l *zap.Logger }

func (a zapAdapter) Error(msg string, err error, fields watermill.LogFields) {
	a.l.Error(msg, append(zapFields(fields), zap.Error(err))...)
}

func (a zapAdapter) Info(msg string, fields watermill.LogFields) {
	a.l.Info(msg, zapFields(fields)...)
}

func (a zapAdapter) Debug(msg string, fields watermill.LogFields) {
	a.l.Debug(msg, zapFields(fields)...)
}

func (a zapAdapter) Trace(msg string, fields watermill.LogFields) {
	a.l.Debug(msg, zapFields(fields)...)
}

func (a zapAdapter) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return zapAdapter{l: a.l.With(zapFields(fields)...)}
}

func zapFields(fields watermill.LogFields) []zap.Field {
	out := make([]zap.Field, 0, len(fields)+1)
	for k, v := range fields {
		out = append(out, zap.Any(k, v))
	}
	return out
}

// defaultLogger is the adapter of a config whose Logger is nil: Watermill's
// standard logger (info and errors to stderr), so that the warnings of the
// queue underneath are seen.
func defaultLogger() watermill.LoggerAdapter { return watermill.NewStdLogger(false, false) }

// zapFor returns the *zap.Logger the queue package logs to on behalf of a
// Pub/Sub configured with adapter a: the zap logger itself when a came from
// ZapLogger, else a zap core that forwards to a. Zap's Warn and above go to
// a's Error (a watermill.LoggerAdapter has no warning level), Info to Info,
// Debug to Debug.
func zapFor(a watermill.LoggerAdapter) *zap.Logger {
	switch a := a.(type) {
	case zapAdapter:
		return a.l
	case watermill.NopLogger:
		return zap.NewNop()
	case *watermill.StdLoggerAdapter:
		if a.DebugLogger == nil {
			// Debug entries (one per delivered message) would be encoded
			// for an adapter that drops them.
			return zap.New(&adapterCore{a: a, enab: zapcore.InfoLevel})
		}
	}
	return zap.New(&adapterCore{a: a, enab: zapcore.DebugLevel})
}

// adapterCore is a zapcore.Core that writes to a watermill.LoggerAdapter.
type adapterCore struct {
	a    watermill.LoggerAdapter
	enab zapcore.Level
}

func (c *adapterCore) Enabled(l zapcore.Level) bool { return l >= c.enab }

func (c *adapterCore) With(fields []zapcore.Field) zapcore.Core {
	return &adapterCore{a: c.a.With(logFields(fields)), enab: c.enab}
}

func (c *adapterCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *adapterCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	lf := logFields(fields)
	msg := e.Message
	if e.LoggerName != "" {
		msg = e.LoggerName + ": " + msg
	}
	switch {
	case e.Level >= zapcore.WarnLevel:
		var err error
		if v, ok := lf["error"]; ok {
			delete(lf, "error")
			err = fmt.Errorf("%v", v)
		}
		if e.Level == zapcore.WarnLevel {
			lf["level"] = "warn"
		}
		c.a.Error(msg, err, lf)
	case e.Level == zapcore.InfoLevel:
		c.a.Info(msg, lf)
	default:
		c.a.Debug(msg, lf)
	}
	return nil
}

func (c *adapterCore) Sync() error { return nil }

// logFields turns zap fields into Watermill's.
func logFields(fields []zapcore.Field) watermill.LogFields {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	return watermill.LogFields(enc.Fields)
}
