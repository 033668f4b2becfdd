package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestForwardReportsUnreachableBrokers: a wrong --brokers (issue 37: 25 s
// of "starting" and nothing else, /readyz "consumer not started", and
// Ctrl-C exiting 0 without a word) is a warning naming the address and
// the error, /readyz says it cannot reach the brokers, and SIGTERM says
// that no broker was ever reached and exits 1.
func TestForwardReportsUnreachableBrokers(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, time.Minute)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there
	ep := newEndpoint(t, func(int, int) reply { return reply{} })
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "g", "--topic", "t", "--url", ep.srv.URL,
		"--metrics-listen", "127.0.0.1:0")
	// Well before the 30 s the start check gives the brokers, after
	// which the old code said its first word.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if !p.stderr.wait(wctx, "cannot reach broker", p.exited) {
		t.Fatalf("no warning about the unreachable broker; stderr:\n%s", tail(p.stderr))
	}
	log := p.stderr.String()
	_, warning, _ := strings.Cut(log, "cannot reach broker")
	warning, _, _ = strings.Cut(warning, "\n")
	if !strings.Contains(warning, "broker="+addr) || !strings.Contains(warning, "connection refused") {
		t.Errorf("the warning does not name the address and the error: %s", warning)
	}
	_, after, _ := strings.Cut(log, "metrics_listen=")
	status, _, _ := strings.Cut(after, "\n")
	code, body := readyz(ctx, status) // certificate_test.go
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot reach brokers "+addr) || !strings.Contains(body, "connection refused") {
		t.Errorf("GET /readyz = %d %q, want 503 saying it cannot reach %s and why", code, body, addr)
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 1 {
		t.Errorf("exit code %d after SIGTERM with no broker ever reached, want 1; stderr:\n%s", code, tail(p.stderr))
	}
	if !strings.Contains(p.stderr.String(), "stopped before it ever reached a broker") {
		t.Errorf("the stop does not say no broker was reached; stderr:\n%s", tail(p.stderr))
	}
}

// TestForwardExplainsAJoinHeldByADeadMember: restarted after kill -9, a
// member waits for the dead one's session (issue 37: 44 s of silence
// before "partitions assigned"); the log says so before the partitions
// come: which group, which protocol, at most how long, and what shortens
// it, naming the member the group still counts.
func TestForwardExplainsAJoinHeldByADeadMember(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2")
	produceIndexed(ctx, t, "held", 10, 2, kgo.SeedBrokers(addr))
	ep := newEndpoint(t, func(int, int) reply { return reply{} })
	// Long enough for the note (joinNote, 8s after the start check) on a
	// loaded machine, short enough for the test.
	args := []string{"--brokers", addr, "--group", "held-g", "--topic", "held", "--url", ep.srv.URL, "--session-timeout", "30s"}
	p := startForward(ctx, t, bin, nil, args...)
	if !p.stderr.wait(ctx, "kpar: partitions assigned", p.exited) {
		t.Fatalf("the first member got no partitions; stderr:\n%s", tail(p.stderr))
	}
	if code := p.stop(ctx, t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit code %d after SIGKILL, want death by signal", code)
	}
	p = startForward(ctx, t, bin, nil, args...)
	if !p.stderr.wait(ctx, "kpar: partitions assigned", p.exited) {
		t.Fatalf("the restarted member got no partitions; stderr:\n%s", tail(p.stderr))
	}
	log := p.stderr.String()
	note, assigned := strings.Index(log, "no partitions assigned yet"), strings.Index(log, "kpar: partitions assigned")
	if note < 0 || note > assigned {
		t.Fatalf("no note on the wait before the partitions came; stderr:\n%s", tail(p.stderr))
	}
	line, _, _ := strings.Cut(log[note:], "\n")
	for _, want := range []string{"group=held-g", "group_protocol=classic", "--session-timeout (30s here)", "--instance-id", "SIGTERM", "other_members="} {
		if !strings.Contains(line, want) {
			t.Errorf("the note lacks %q: %s", want, line)
		}
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
}

// TestBrokerWatchRepeatsEveryTenSeconds: in virtual time, an address that
// fails every connection for 25 s is a warning at its first failure and a
// summary every brokerReport after, not a line per attempt; /readyz names
// it meanwhile; the first success says it is reachable again.
func TestBrokerWatchRepeatsEveryTenSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &lineLog{}
		w := newBrokerWatch(slog.New(logs), "kpar forward")
		meta := kgo.BrokerMetadata{NodeID: -1, Host: "127.0.0.1", Port: 9999}
		refused := errors.New("dial tcp 127.0.0.1:9999: connect: connection refused")
		if _, bad := w.unreachable(); bad {
			t.Fatal("unreachable before any attempt")
		}
		for range 50 { // every 500ms for 25s
			w.OnBrokerConnect(meta, 0, nil, refused)
			time.Sleep(500 * time.Millisecond)
		}
		why, bad := w.unreachable()
		if !bad || why != "cannot reach brokers 127.0.0.1:9999 for 25s: "+refused.Error() {
			t.Errorf("unreachable() = %q, %v", why, bad)
		}
		w.OnBrokerConnect(meta, 0, nil, nil)
		if _, bad := w.unreachable(); bad {
			t.Error("unreachable after a success")
		}
		want := []string{
			"WARN kpar forward: cannot reach broker; retrying (check --brokers, and that the broker's advertised listeners resolve and are reachable from here)",
			"WARN kpar forward: still cannot reach broker; retrying", // at 10s
			"WARN kpar forward: still cannot reach broker; retrying", // at 20s
			"INFO kpar forward: broker reachable again",
		}
		if got := logs.lines(); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// lineLog keeps "LEVEL message" of each record.
type lineLog struct {
	mu  sync.Mutex
	got []string
}

func (h *lineLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *lineLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, r.Level.String()+" "+r.Message)
	return nil
}
func (h *lineLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *lineLog) WithGroup(string) slog.Handler      { return h }
func (h *lineLog) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}
