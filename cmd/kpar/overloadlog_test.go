package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestForwardBatchOverloadEndsWithRecovered: with --batch, one item
// answered 503 once among 2xx items (issue 37: "downstream overloaded ...
// dispatching slows down to probes", then neither "still overloaded" nor
// "recovered" for 28 s although the retry succeeded) is followed by
// "downstream recovered" once the retry succeeded and the topic drained.
// The start line says the requests are JSON.
func TestForwardBatchOverloadEndsWithRecovered(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2")
	const n = 20
	produceIndexed(ctx, t, "orders", n, 10, kgo.SeedBrokers(addr))
	ep, _ := newBatchEndpoint(t, nil, func(i, attempt int) reply {
		if i == 7 && attempt == 1 {
			return reply{status: http.StatusServiceUnavailable}
		}
		return reply{}
	})
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "g", "--topic", "orders", "--url", ep.srv.URL, "--batch", "4")
	ep.waitFor(ctx, t, p, "every record delivered", func() bool { return ep.delivered() == n })
	// overloadEnds (1s) after the 503 at most; the bound is for a loaded machine.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !p.stderr.wait(wctx, "kpar: downstream recovered", p.exited) {
		t.Errorf("no \"recovered\" after the overloaded batch item's retry succeeded; stderr:\n%s", tail(p.stderr))
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	log := p.stderr.String()
	if got := strings.Count(log, "kpar: downstream overloaded"); got != 1 {
		t.Errorf("\"downstream overloaded\" logged %d times, want once; stderr:\n%s", got, tail(p.stderr))
	}
	start, _, _ := strings.Cut(log, "\n")
	if !strings.Contains(start, "kpar forward starting") || !strings.Contains(start, "content_type=application/json") {
		t.Errorf("the start line does not say batch requests are JSON: %s", start)
	}
}
