package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/internal/ledger"
)

// TestChaosMemberWithAnotherOrderingExits starts, in both group protocols,
// a `kpar forward --ordering unordered` member in a group whose member
// orders by key and has committed: the newcomer must exit 1 naming the
// ordering before it delivers a single record, and the first member goes
// on, losing nothing and breaking no key's order, while records keep
// coming.
func TestChaosMemberWithAnotherOrderingExits(t *testing.T) {
	t.Parallel()
	inEachProtocol(t, func(t *testing.T, p kpar.Protocol) {
		const concurrency, keys, perSecond = 16, 50, 200
		bin, ctx := e2e(t, 2*time.Minute)
		cc := newChaosCluster(ctx, t, bin, 4, "mixed")
		addr, topic, group := cc.addr, cc.name("mixed"), cc.name("mixed")
		l := ledger.New(ledger.ByKey, 0)
		ep := newLedgerEndpoint(t, l, topic, func(i, _ int) (int, time.Duration) {
			return http.StatusOK, time.Duration(i%5) * time.Millisecond
		})
		var intruded atomic.Int64 // requests from the member of the other ordering
		other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { intruded.Add(1) }))
		defer other.Close()
		args := []string{"--brokers", addr, "--group", group, "--topic", topic,
			"--concurrency", strconv.Itoa(concurrency), "--retry-backoff", "5ms", "--log-level", chaosLogLevel()}
		args = append(args, setGroupTimeouts(ctx, t, addr, group, p, 6*time.Second)...)

		prod := startChaosProducer(ctx, t, addr, topic, perSecond, keys, l)
		w := watchCommits(ctx, t, addr, group, topic, handlings(l))
		byKey := startMember(ctx, t, bin, append(args, "--ordering", "key", "--url", ep.srv.URL)...)
		select {
		case <-w.firstCommit():
		case <-byKey.exited:
			t.Fatalf("the key-ordered member exited (%v); stderr:\n%s", byKey.waitErr, tail(byKey.stderr))
		case <-ctx.Done():
			t.Fatalf("no commit from the key-ordered member: %v; stderr:\n%s", ctx.Err(), tail(byKey.stderr))
		}

		began := time.Now()
		unordered := startMember(ctx, t, bin, append(args, "--ordering", "unordered", "--url", other.URL)...)
		code := unordered.wait(ctx, t)
		out := unordered.stderr.String()
		t.Logf("the unordered member exited %d after %v: %s", code, time.Since(began).Round(time.Millisecond), lastLine(out))
		if code != 1 {
			t.Errorf("the unordered member exited %d, want 1; stderr:\n%s", code, tail(unordered.stderr))
		}
		for _, s := range []string{"ordering by key", "orders by unordered"} {
			if !strings.Contains(out, s) {
				t.Errorf("the unordered member's error does not say %q:\n%s", s, tail(unordered.stderr))
			}
		}
		if n := intruded.Load(); n > 0 {
			t.Errorf("the unordered member delivered %d requests", n)
		}

		produced := prod.Stop(t)
		waitReached(t, l, produced, time.Minute, "every record, by the key-ordered member")
		if code := byKey.stop(ctx, t, syscall.SIGTERM); code != 0 {
			t.Errorf("the key-ordered member exited %d after SIGTERM, want 0; stderr:\n%s", code, tail(byKey.stderr))
		}
		checkCommittedAtEnd(ctx, t, addr, group, topic)
		commits := w.result(t)
		rep := l.Report()
		t.Logf("%d records: %+v; longest commit gap %v", produced, rep, commits.Longest)
		if err := rep.Check(0); err != nil {
			t.Error(err)
		}
	})
}

// lastLine returns the last line of a process's output.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}
