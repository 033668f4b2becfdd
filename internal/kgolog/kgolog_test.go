package kgolog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRepeatedWarningsAreThinned: a warning kgo repeats without a pause
// (25,000 "unable to load producer ID" a second while no broker answers)
// is logged once a second, with how many were left out; other messages,
// and info lines, pass as they come.
func TestRepeatedWarningsAreThinned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		l := New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
		for range 1000 {
			l.Log(kgo.LogLevelWarn, "unable to load producer ID")
			l.Log(kgo.LogLevelInfo, "chatty")
		}
		l.Log(kgo.LogLevelError, "another")
		time.Sleep(thinPeriod)
		l.Log(kgo.LogLevelWarn, "unable to load producer ID", "broker", 1)

		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		var warns []string
		chatty := 0
		for _, line := range lines {
			switch {
			case strings.Contains(line, "unable to load producer ID"):
				warns = append(warns, line)
			case strings.Contains(line, "chatty"):
				chatty++
			}
		}
		if len(warns) != 2 || strings.Contains(warns[0], "repeated") || !strings.Contains(warns[1], "repeated=999") || !strings.Contains(warns[1], "broker=1") {
			t.Errorf("the repeated warning logged as %q, want it once, then once a second later with repeated=999", warns)
		}
		if chatty != 1000 {
			t.Errorf("%d info lines of 1000 logged, want every one", chatty)
		}
		if !strings.Contains(buf.String(), "kgo: another") {
			t.Error("another message was thinned with the first")
		}
	})
}

// TestTheZeroLoggerDoesNotThin: Logger{L: l} logs every line.
func TestTheZeroLoggerDoesNotThin(t *testing.T) {
	var buf bytes.Buffer
	l := Logger{L: slog.New(slog.NewTextHandler(&buf, nil))}
	for range 3 {
		l.Log(kgo.LogLevelWarn, "again")
	}
	if n := strings.Count(buf.String(), "kgo: again"); n != 3 {
		t.Errorf("%d lines, want 3", n)
	}
}
