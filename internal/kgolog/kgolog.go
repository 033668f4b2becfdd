// Package kgolog adapts a *slog.Logger to franz-go's kgo.Logger: the one
// adapter of the repository, used by the Consumer's client and by the
// command line's clients (an internal package: github.com/kpar/kpar/...
// paths may import it from any of the repository's modules).
package kgolog

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Logger routes franz-go's logs to L. franz-go's info level is chatty
// (every fetch session, every heartbeat), so it logs at slog's debug
// level, and its debug level below that (slog.LevelDebug-4); its warnings
// and errors keep their levels. Messages are prefixed "kgo: ".
//
// A warning or error that repeats is logged at most once per second per
// message, with the count of those left out since ("repeated"): a client
// retrying without a pause repeats one message thousands of times a
// second (kgo's transactional producer while no broker answers: 25,000
// "unable to load producer ID" a second), which buries every other line.
// Logger's zero value does not thin; New's does.
type Logger struct {
	L *slog.Logger

	thin *thinning
}

// New returns the Logger of l, which thins repeated warnings and errors.
func New(l *slog.Logger) Logger { return Logger{L: l, thin: &thinning{seen: map[string]*repeats{}}} }

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
	if lvl >= slog.LevelWarn && k.thin != nil {
		left, ok := k.thin.pass(msg, time.Now())
		if !ok {
			return
		}
		if left > 0 {
			keyvals = append(keyvals, "repeated", left)
		}
	}
	k.L.Log(context.Background(), lvl, "kgo: "+msg, keyvals...)
}

// thinPeriod is how often one message may be logged.
const thinPeriod = time.Second

// thinning is what a Logger and its copies have logged.
type thinning struct {
	mu   sync.Mutex // guards seen
	seen map[string]*repeats
}

// repeats is one message's last logging and the times it was left out
// since. kgo's messages are constant strings: the map stays small.
type repeats struct {
	last time.Time
	left int
}

// pass reports whether msg may be logged at now, and how many times it
// was left out since it last was.
func (t *thinning) pass(msg string, now time.Time) (left int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.seen[msg]
	if r == nil {
		t.seen[msg] = &repeats{last: now}
		return 0, true
	}
	if now.Sub(r.last) < thinPeriod {
		r.left++
		return 0, false
	}
	left = r.left
	r.last, r.left = now, 0
	return left, true
}
