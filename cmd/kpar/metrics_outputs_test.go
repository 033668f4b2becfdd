package main

import (
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestForwardRepliesWithMetrics runs `kpar forward --reply-topic ...
// --metrics-listen`, with and without --exactly-once: it starts (this
// panicked at start with "duplicate metrics collector registration"),
// delivers every record, produces every reply, counts the replies'
// produce traffic in /metrics, and exits 0 on SIGTERM.
func TestForwardRepliesWithMetrics(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2")
	const n = 40
	for _, tc := range []struct {
		name, short string
		extra       []string
	}{
		{"at least once", "alo", nil},
		{"exactly once", "eos", []string{"--exactly-once", "--instance-id", "metrics-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, replies, group := "in-"+tc.short, "replies-"+tc.short, "metrics-"+tc.short
			produceIndexed(ctx, t, in, n, 4, kgo.SeedBrokers(addr))
			ep := newEndpoint(t, func(int, int) reply { return reply{} })
			p := startForward(ctx, t, bin, nil, append([]string{"--brokers", addr, "--group", group, "--topic", in,
				"--url", ep.srv.URL, "--reply-topic", replies, "--metrics-listen", "127.0.0.1:0"}, tc.extra...)...)
			ep.waitFor(ctx, t, p, "every record delivered", func() bool { return ep.delivered() == n })

			cl := newClient(t, addr, kgo.ConsumeTopics(replies), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			defer cl.Close()
			for got := 0; got < n; {
				if ctx.Err() != nil {
					t.Fatalf("%s: read %d of %d replies: %v; stderr:\n%s", replies, got, n, ctx.Err(), tail(p.stderr))
				}
				got += len(cl.PollFetches(ctx).Records())
			}

			_, after, _ := strings.Cut(p.stderr.String(), "metrics_listen=")
			status, _, _ := strings.Cut(after, "\n")
			if _, _, err := net.SplitHostPort(status); err != nil {
				t.Fatalf("no metrics_listen address in the startup line; stderr:\n%s", tail(p.stderr))
			}
			for _, want := range []string{
				`kpar_records_handled_total{topic="` + in + `"}`,
				`kpar_client_fetch_bytes_total{node_id="0",topic="` + in + `"}`,
				`kpar_client_produce_bytes_total{node_id="0",topic="` + replies + `"}`,
			} {
				if body := httpGet(ctx, t, "http://"+status+"/metrics"); !strings.Contains(body, want) {
					t.Errorf("GET /metrics does not contain %s:\n%s", want, body)
				}
			}
			if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
				t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
			}
		})
	}
}
