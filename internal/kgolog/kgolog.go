// Package kgolog adapts a *slog.Logger to franz-go's kgo.Logger: the one
// adapter of the repository, used by the Consumer's client and by the
// command line's clients (an internal package: github.com/kpar/kpar/...
// paths may import it from any of the repository's modules).
package kgolog

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Logger routes franz-go's logs to L. franz-go's info level is chatty
// (every fetch session, every heartbeat), so it logs at slog's debug
// level, and its debug level below that (slog.LevelDebug-4); its warnings
// and errors keep their levels. Messages are prefixed "kgo: ".
type Logger struct{ L *slog.Logger }

var _ kgo.Logger = Logger{}

// Level implements kgo.Logger.
func (k Logger) Level() kgo.LogLevel {
	ctx := context.Background()
	switch {
	case k.L.Enabled(ctx, slog.LevelDebug-4):
		return kgo.LogLevelDebug
	case k.L.Enabled(ctx, slog.LevelDebug):
		return kgo.LogLevelInfo
	case k.L.Enabled(ctx, slog.LevelWarn):
		return kgo.LogLevelWarn
	case k.L.Enabled(ctx, slog.LevelError):
		return kgo.LogLevelError
	}
	return kgo.LogLevelNone
}

// Log implements kgo.Logger.
func (k Logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelDebug
	switch level {
	case kgo.LogLevelDebug:
		lvl = slog.LevelDebug - 4
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelWarn:
		lvl = slog.LevelWarn
	}
	k.L.Log(context.Background(), lvl, "kgo: "+msg, keyvals...)
}
