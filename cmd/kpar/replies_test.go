package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/forward"
)

// TestForwardRepliesExactlyOnceAcrossKills runs `kpar forward --reply-topic
// replies --exactly-once --instance-id ... --ordering key` on keyed records
// against an endpoint that answers each with a JSON body, SIGKILLs it and
// restarts it again and again, and reads the reply topic read_committed:
// every input has exactly one reply, keyed like it, with the headers that
// name it, and the replies of a key come in input order. The default is 3
// kills over 3,000 records; KPAR_CHAOS_SOAK=1 kills 10 times over 20,000.
func TestForwardRepliesExactlyOnceAcrossKills(t *testing.T) {
	t.Parallel()
	n, kills := 3000, 3
	if os.Getenv("KPAR_CHAOS_SOAK") != "" {
		n, kills = 20000, 10
	}
	const keys = 50
	bin, ctx := e2e(t, 3*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "4")
	produceIndexed(ctx, t, "in", n, keys, kgo.SeedBrokers(addr))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		time.Sleep(5 * time.Millisecond) // the service's work: kills fall mid-stream
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"in":%s}`, body)
	}))
	defer srv.Close()
	args := []string{"--brokers", addr, "--topic", "in", "--group", "replies", "--url", srv.URL,
		"--reply-topic", "replies", "--exactly-once", "--instance-id", "fwd-1", "--ordering", "key",
		"--concurrency", "4", "--log-level", "warn"}
	// One reader for the whole test: each call reads what came since,
	// until a few polls in a row bring nothing.
	reader := newClient(t, addr, kgo.ConsumeTopics("replies"), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer reader.Close()
	var out []*kgo.Record
	replies := func() []*kgo.Record {
		for quiet := 0; quiet < 3 && ctx.Err() == nil; {
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
	for k := range kills {
		p := startForward(ctx, t, bin, nil, args...)
		// Kill once the committed replies passed this run's share.
		for target := (k + 1) * n / (kills + 1); len(replies()) < target && ctx.Err() == nil; {
		}
		select {
		case <-p.exited:
			t.Fatalf("kill %d: kpar forward exited by itself (%v); stderr:\n%s", k, p.waitErr, tail(p.stderr))
		default:
		}
		if code := p.stop(ctx, t, syscall.SIGKILL); code != -1 {
			t.Fatalf("kill %d: exit code %d after SIGKILL, want death by signal", k, code)
		}
	}
	p := startForward(ctx, t, bin, nil, args...)
	var got []*kgo.Record
	for got = replies(); len(got) < n && ctx.Err() == nil; got = replies() {
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	got = replies()
	seen := map[int]int{}
	last := map[string]int{}
	for _, r := range got {
		var v struct{ In int }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("reply %q: %v", r.Value, err)
		}
		seen[v.In]++
		if want := fmt.Sprintf("k%02d", v.In%keys); string(r.Key) != want {
			t.Errorf("reply to %d keyed %q, want %q", v.In, r.Key, want)
		}
		if prev, ok := last[string(r.Key)]; ok && prev >= v.In && seen[v.In] == 1 {
			t.Errorf("reply to %d after the reply to %d: key %q out of order", v.In, prev, r.Key)
		}
		last[string(r.Key)] = v.In
		hs := map[string]string{}
		for _, h := range r.Headers {
			hs[h.Key] = string(h.Value)
		}
		if hs["content-type"] != "application/json" || hs[forward.HeaderReplyTopic] != "in" || hs[forward.HeaderReplyOffset] == "" {
			t.Errorf("reply to %d: headers %v", v.In, hs)
		}
	}
	for i := range n {
		if seen[i] != 1 {
			t.Errorf("input %d has %d replies, want exactly 1", i, seen[i])
		}
	}
	t.Logf("%d kills, %d records: %d replies read_committed", kills, n, len(got))
}
