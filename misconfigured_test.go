package kpar

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	invariant "github.com/kpar/kpar/internal/ledger"
)

// logRecorder keeps what a test's logger printed, for the test to count
// lines in.
type logRecorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logRecorder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logRecorder) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// lines returns the lines that contain every one of parts.
func (l *logRecorder) lines(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for line := range strings.SplitSeq(l.buf.String(), "\n") {
		ok := line != ""
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

var errBadCertificate = errors.New("forward: the TLS certificate of 127.0.0.1:8443 does not verify: x509: certificate signed by unknown authority")

// testMisconfigured: a downstream whose certificate stopped verifying
// (every attempt fails Misconfigured) until 40 such failures were seen
// holds the records: with MaxAttempts(1) nothing is dead-lettered, every
// record is handled once it is fixed, and the log says so once at ERROR
// with the error, and once when it is over.
func testMisconfigured(t *testing.T, src flowSource) {
	const n, failures = 200, 40
	cl := newCell(t, src, n, func(i int) int { return i % 20 })
	l := cl.produced(invariant.Unordered)
	d := newDownUntil(cl, l, failures, Misconfigured(errBadCertificate))
	sink := &memSink{}
	logs := new(logRecorder)
	if !cl.mustRun(d, MaxAttempts(1), DeadLetters(sink), WithLogger(logs.logger())) {
		return
	}
	if dead := lettersByIndex(sink); len(dead) > 0 {
		t.Errorf("%d of %d records dead-lettered for a certificate that stopped verifying (%d refused attempts), first %s",
			len(dead), n, d.failed.Load(), cl.describe(firstKeys(dead, 1)[0]))
	}
	if rep := l.Report(); rep.Handled != n {
		t.Errorf("%d of %d records handled (%d dead-lettered): %s", rep.Handled, n, cl.fin.deadLettered(), cl.unfinished())
	}
	if got := logs.lines("level=ERROR", "refuses every attempt for a configuration error", "x509: certificate signed by unknown authority"); len(got) != 1 {
		t.Errorf("%d ERROR lines saying the downstream refuses every attempt, with the x509 error, want 1 (the spell lasted under 10s):\n%s",
			len(got), strings.Join(logs.lines("level="), "\n"))
	}
	if got := logs.lines("configuration error is over"); len(got) != 1 {
		t.Errorf("%d lines saying the configuration error is over, want 1:\n%s", len(got), strings.Join(logs.lines("level="), "\n"))
	}
	if got := logs.lines("handler failed"); len(got) > 0 {
		t.Errorf("%d \"handler failed\" lines for refused attempts, want none (one line per spell): first %s", len(got), got[0])
	}
}
