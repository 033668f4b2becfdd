package kpar

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// logMessages is a slog.Handler that keeps the messages of warnings.
type logMessages struct {
	mu   sync.Mutex
	msgs []string
}

func (h *logMessages) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *logMessages) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}
func (h *logMessages) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logMessages) WithGroup(string) slog.Handler      { return h }

func (h *logMessages) find(part string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.msgs {
		if strings.Contains(m, part) {
			return m, true
		}
	}
	return "", false
}

// TestShareStuckRecordWarningSaysNoCommitIsHeld: a record that stays
// unfinished past StuckAfter in a share group is reported as holding this
// member's next acquisition, not commits, which a share group has none of
// (it said "window start stuck: one record has held back commits").
func TestShareStuckRecordWarningSaysNoCommitIsHeld(t *testing.T) {
	const topic = "share-stuck"
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	produce(t, c, topic, 5, 5)
	logs := &logMessages{}
	release, started := make(chan struct{}), make(chan struct{})
	var once sync.Once
	_, stop := runShare(t, c, topic, HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if r.Offset != 0 {
			return nil
		}
		once.Do(func() { close(started) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}), StuckAfter(100*time.Millisecond), WithLogger(slog.New(logs)))
	waitFor(t, started, 20*time.Second, "the held record to start")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if msg, ok := logs.find("stuck"); ok {
			if msg != stuckShareMessage {
				t.Errorf("warning %q, want %q", msg, stuckShareMessage)
			}
			if strings.Contains(msg, "held back commits") {
				t.Errorf("a share group's warning speaks of commits: %q", msg)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no stuck warning within 20s of a record held past StuckAfter")
		}
		time.Sleep(10 * time.Millisecond) // polling the log, not waiting for time to pass
	}
	close(release)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
