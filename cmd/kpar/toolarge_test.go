package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// TestForwardReplyTooLargeForItsTopic runs `kpar forward --reply-topic
// replies --dlq-topic in.dlq` (at least once, and with --exactly-once)
// against an endpoint whose answer to one record is 200 KB, under kpar's
// 1 MiB check but over the reply topic's max.message.bytes of 100 KB:
// that record is dead-lettered saying its reply was too large for the
// topic, every other record's reply is produced, everything is committed,
// and SIGTERM exits 0 without a failed final commit.
func TestForwardReplyTooLargeForItsTopic(t *testing.T) {
	for _, eos := range []bool{false, true} {
		name := "at-least-once"
		if eos {
			name = "exactly-once"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			replyTooLarge(t, eos)
		})
	}
}

func replyTooLarge(t *testing.T, eos bool) {
	const n, big = 200, 17
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2")
	cl := newClient(t, addr)
	defer cl.Close()
	limit := "100000"
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 2, 1, map[string]*string{"max.message.bytes": &limit}, "replies"); err != nil {
		t.Fatal(err)
	}
	produceIndexed(ctx, t, "in", n, 10, kgo.SeedBrokers(addr))
	huge := make([]byte, 150_000)
	rand.Read(huge)
	hugeReply := base64.StdEncoding.EncodeToString(huge) // 200 KB that snappy cannot shrink under 100 KB
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		if string(body) == fmt.Sprint(big) {
			fmt.Fprint(w, hugeReply)
			return
		}
		fmt.Fprintf(w, "reply to %s", body)
	}))
	defer srv.Close()
	args := []string{"--brokers", addr, "--topic", "in", "--group", "g", "--url", srv.URL,
		"--reply-topic", "replies", "--dlq-topic", "in.dlq", "--instance-id", "fwd-1", "--log-level", "warn"}
	if eos {
		args = append(args, "--exactly-once")
	}
	p := startForward(ctx, t, bin, nil, args...)
	waitCommitted(ctx, t, addr, "g", "in", n)
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	log := p.stderr.String()
	if strings.Contains(log, "final commit failed") || strings.Contains(log, "overloaded") {
		t.Errorf("the log speaks of a failed final commit or an overload:\n%s", tail(p.stderr))
	}
	letters := readCommitted(ctx, t, addr, "in.dlq", 1)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	l := deadletter.FromRecord(letters[0])
	if string(l.Record.Value) != fmt.Sprint(big) || !strings.Contains(l.Message, "too large") {
		t.Errorf("dead letter of %q saying %q, want record %d and its reply too large", l.Record.Value, l.Message, big)
	}
	seen := map[string]int{}
	for _, r := range readCommitted(ctx, t, addr, "replies", n-1) {
		seen[string(r.Value)]++
	}
	for i := range n {
		want := 1
		if i == big {
			want = 0
		}
		if c := seen[fmt.Sprintf("reply to %d", i)]; c < want || (eos && c != want) {
			t.Errorf("record %d has %d replies, want %d", i, c, want)
		}
	}
	if len(seen) != n-1 {
		t.Errorf("%d distinct replies, want %d", len(seen), n-1)
	}
}

// readCommitted reads topic read_committed from the start until it has
// want records and a few polls in a row bring nothing more.
func readCommitted(ctx context.Context, t *testing.T, addr, topic string, want int) []*kgo.Record {
	t.Helper()
	reader := newClient(t, addr, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer reader.Close()
	var out []*kgo.Record
	for quiet := 0; (len(out) < want || quiet < 3) && ctx.Err() == nil; {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		fs := reader.PollFetches(pctx)
		cancel()
		before := len(out)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
		if len(out) == before {
			quiet++
		}
	}
	return out
}
