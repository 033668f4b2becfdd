package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestForwardDeadLettersARecordThatHangsTheEndpoint: every 50th record is
// never answered while the endpoint answers the others at once (issue 35:
// with --attempt-timeout 2s, 38 of 2,000 were held for ever once the rest
// was done, and the commit stuck). With --hang-limit 2s each is
// dead-lettered, saying that it hung the endpoint, every other record is
// delivered and the group's commit reaches the end.
func TestForwardDeadLettersARecordThatHangsTheEndpoint(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "3")
	const n = 300
	hangs := func(i int) bool { return i%50 == 49 }
	produceIndexed(ctx, t, "orders", n, 6, kgo.SeedBrokers(addr))
	ep := newEndpoint(t, func(i, _ int) reply { return reply{hang: hangs(i)} })
	dlq := filepath.Join(t.TempDir(), "dead.jsonl")
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "g", "--topic", "orders",
		"--url", ep.srv.URL, "--dead-letters", "file://"+dlq, "--attempt-timeout", "500ms", "--hang-limit", "2s")
	ep.waitFor(ctx, t, p, "every other record delivered", func() bool { return ep.delivered() == n-n/50 })
	waitCommitted(ctx, t, addr, "g", "orders", n)
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	b, err := os.ReadFile(dlq)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != n/50 {
		t.Errorf("%d dead letters, want %d (one per hanging record):\n%.3000s", len(lines), n/50, b)
	}
	for _, l := range lines {
		if !strings.Contains(l, "hung the downstream") {
			t.Errorf("dead letter does not say the record hung the endpoint: %.500s", l)
		}
	}
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		if strings.Contains(line, "record dead-lettered") {
			t.Logf("log: %.400s", line)
			break
		}
	}
}
