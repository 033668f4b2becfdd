package kpar

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kgoLogger routes franz-go's logs to the Consumer's slog.Logger. franz-go's
// info level is chatty (every fetch session, every heartbeat), so it logs at
// slog's debug level, and its debug level below that (slog.LevelDebug-4);
// its warnings and errors keep their levels.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel {
	ctx := context.Background()
	switch {
	case k.l.Enabled(ctx, slog.LevelDebug-4):
		return kgo.LogLevelDebug
	case k.l.Enabled(ctx, slog.LevelDebug):
		return kgo.LogLevelInfo
	case k.l.Enabled(ctx, slog.LevelWarn):
		return kgo.LogLevelWarn
	case k.l.Enabled(ctx, slog.LevelError):
		return kgo.LogLevelError
	}
	return kgo.LogLevelNone
}

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelDebug
	switch level {
	case kgo.LogLevelDebug:
		lvl = slog.LevelDebug - 4
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelWarn:
		lvl = slog.LevelWarn
	}
	k.l.Log(context.Background(), lvl, "kgo: "+msg, keyvals...)
}
