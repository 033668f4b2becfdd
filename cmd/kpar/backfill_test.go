package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/progress"
	"github.com/kpar/kpar/internal/testkit"
)

// startBackfill runs `kpar backfill args...` from the built binary.
func startBackfill(ctx context.Context, t *testing.T, bin string, stdout io.Writer, args ...string) *process {
	t.Helper()
	return startCommand(ctx, t, bin, "backfill", nil, stdout, args...)
}

// TestBackfillSIGKILLAndResumeLosesNothing runs `kpar backfill --readers 4`
// over offsets 5,000-15,000 of a one-partition topic of 20,000 records,
// kills it with SIGKILL half-way and runs it again with the same progress
// file: every offset of the range reaches the endpoint, none outside it,
// and the second run starts each slice exactly at its saved progress.
func TestBackfillSIGKILLAndResumeLosesNothing(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1")
	const topic, n, from, to, readers, window = "range", 20_000, 5_000, 15_000, 4, 1_000
	produceIndexed(ctx, t, topic, n, 10, kgo.SeedBrokers(addr)) // value = index = offset

	// Until the kill, the 1,001st record of each slice hangs: the slice's
	// progress stops below it while the records behind it finish until
	// its window is full. Those are what a kill makes the next run repeat.
	slice := int64((to - from) / readers)
	stuck := func(i int) bool { return i >= from && i < to && int64(i-from)%slice == window }
	ep, open := newGatedEndpoint(t, func(i, attempt int) reply {
		if stuck(i) {
			return reply{hang: true}
		}
		return reply{}
	})
	file := filepath.Join(t.TempDir(), "progress.json")
	args := []string{"--brokers", addr, "--topic", topic, "--from", fmt.Sprint(from), "--to", fmt.Sprint(to),
		"--url", ep.srv.URL, "--readers", fmt.Sprint(readers), "--progress", file, "--progress-interval", "20ms",
		"--attempt-timeout", "1s", "--max-attempts", "100000", "--retry-backoff", "5ms", "--retry-backoff-max", "20ms"}

	p := startBackfill(ctx, t, bin, io.Discard, args...)
	saved := func() *progress.State {
		s, _ := progress.Load(file)
		return s
	}
	// Re-checked on every request the endpoint sees; the stuck records'
	// retries keep them coming.
	ep.waitFor(ctx, t, p, "every slice stuck with a full window and its progress saved", func() bool {
		if ep.delivered() < readers*(2*window-1) {
			return false
		}
		s := saved()
		if s == nil || len(s.Slices) != readers {
			return false
		}
		for _, sl := range s.Slices {
			if sl.Done != sl.From+window {
				return false
			}
		}
		return true
	})
	if code := p.stop(ctx, t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit code %d after SIGKILL, want death by signal", code)
	}
	atKill := saved()
	ep.mu.Lock()
	before := make(map[int]int, len(ep.ok))
	for i, c := range ep.ok {
		before[i] = c
	}
	ep.mu.Unlock()
	open()

	var stdout bytes.Buffer
	p = startBackfill(ctx, t, bin, &stdout, args...)
	if code := p.wait(ctx, t); code != 0 {
		t.Fatalf("resumed run exited %d, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	line := stdout.String()
	if !strings.HasPrefix(line, "kpar backfill: done: ") || strings.Count(line, "\n") != 1 ||
		!strings.Contains(line, " records: ") || !strings.Contains(line, ", 0 dead-lettered, ") {
		t.Errorf("stdout = %q, want one summary line", line)
	}

	ep.mu.Lock()
	defer ep.mu.Unlock()
	if len(ep.bad) > 0 {
		t.Fatalf("malformed requests: %v", ep.bad[0])
	}
	repeats := 0
	for i := range n {
		inRange := i >= from && i < to
		switch c := ep.ok[i]; {
		case inRange && c == 0:
			t.Errorf("offset %d never delivered", i)
		case !inRange && c > 0:
			t.Errorf("offset %d outside the range delivered", i)
		case c > before[i]:
			// Delivered by the resumed run: only at or above its slice's
			// saved progress.
			for _, sl := range atKill.Slices {
				if int64(i) >= sl.From && int64(i) < sl.Done {
					t.Errorf("offset %d delivered again although the progress file had its slice done up to %d", i, sl.Done)
				}
			}
			if before[i] > 0 {
				repeats++
			}
		}
	}
	if repeats > readers*window {
		t.Errorf("%d records repeated after the kill, want at most one window (%d) per slice", repeats, window)
	}
	t.Logf("kill repeated %d records (finished above the saved progress); %s", repeats, strings.TrimSpace(line))
}

// TestBackfillDeadLettersToAFile: `kpar backfill --dead-letters file://`
// writes the records the endpoint refuses (400) to the file, one JSON line
// each, its summary counts them, and it exits 3 (it exited 0, so a
// pipeline did not notice); with --allow-dead-letters the same run exits 0.
func TestBackfillDeadLettersToAFile(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, time.Minute)
	addr := testkit.Cluster(t, kfake.SeedTopics(1, "bfdl"), kfake.AllowAutoTopicCreation()).ListenAddrs()[0]
	const n = 100
	produceIndexed(ctx, t, "bfdl", n, 10, kgo.SeedBrokers(addr))
	ep := newEndpoint(t, func(i, attempt int) reply {
		if i%10 == 0 {
			return reply{status: http.StatusBadRequest}
		}
		return reply{}
	})
	file := filepath.Join(t.TempDir(), "dlq.jsonl")
	var stdout bytes.Buffer
	p := startBackfill(ctx, t, bin, &stdout, "--brokers", addr, "--topic", "bfdl", "--from", "0", "--to", strconv.Itoa(n),
		"--url", ep.srv.URL, "--dead-letters", "file://"+file)
	if code := p.wait(ctx, t); code != 3 {
		t.Fatalf("exit code %d, want 3 (done, with dead letters); stderr:\n%s", code, tail(p.stderr))
	}
	if !strings.Contains(stdout.String(), ", 10 dead-lettered, ") {
		t.Errorf("summary %q, want 10 dead-lettered", strings.TrimSpace(stdout.String()))
	}
	if want := "10 of 100 records were dead-lettered (to file://" + file + "): exit 3"; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, tail(p.stderr))
	}
	allowed := startBackfill(ctx, t, bin, io.Discard, "--brokers", addr, "--topic", "bfdl", "--from", "0", "--to", strconv.Itoa(n),
		"--url", ep.srv.URL, "--dead-letters", "file://"+filepath.Join(t.TempDir(), "again.jsonl"), "--allow-dead-letters")
	if code := allowed.wait(ctx, t); code != 0 {
		t.Errorf("with --allow-dead-letters: exit code %d, want 0; stderr:\n%s", code, tail(allowed.stderr))
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var offsets []int64
	for line := range bytes.Lines(b) {
		var l struct {
			Offset int64 `json:"offset"`
		}
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatalf("dead letter %q: %v", line, err)
		}
		offsets = append(offsets, l.Offset)
	}
	slices.Sort(offsets)
	if want := []int64{0, 10, 20, 30, 40, 50, 60, 70, 80, 90}; !slices.Equal(offsets, want) {
		t.Errorf("dead-lettered offsets %v, want %v", offsets, want)
	}
}

func TestBackfillRejectsBadRangesAndFlags(t *testing.T) {
	addr := testkit.Cluster(t, kfake.SeedTopics(2, "bf")).ListenAddrs()[0]
	produceIndexed(t.Context(), t, "bf", 100, 2, kgo.SeedBrokers(addr), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	other := filepath.Join(t.TempDir(), "other.json")
	if err := progress.Save(other, &progress.State{
		Range:  progress.Range{Topic: "bf", From: "0", To: "40"},
		Slices: []progress.Slice{{Partition: 0, From: 0, To: 40}},
	}); err != nil {
		t.Fatal(err)
	}
	base := func(extra ...string) []string {
		return append([]string{"--brokers", addr, "--topic", "bf", "--url", "http://127.0.0.1:1/in", "--log-level", "warn"}, extra...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // the one line on stderr must contain it
	}{
		{"from not below to", base("--from", "20", "--to", "10"), "from offset 20 is not below to offset 10"},
		{"above the high watermark", base("--from", "0", "--to", "51"), "to offset 51 is above the high watermark 50"},
		{"unknown topic", append(base("--from", "0", "--to", "1"), "--topic", "nope"), `topic "nope": unknown topic`},
		{"unknown partition", base("--partitions", "0,5", "--from", "0", "--to", "1"), "unknown partition 5"},
		{"time after every record", base("--from", "2999-01-01T00:00:00Z", "--to", "3000-01-01T00:00:00Z"), "resolves to no offset"},
		{"progress of another range", base("--from", "0", "--to", "50", "--progress", other), "holds the progress of"},
		{"bad from", base("--from", "yesterday", "--to", "10"), "--from"},
		{"no to", base("--from", "0"), "--to"},
		{"partitions", base("--from", "0", "--to", "1", "--partitions", "0,x"), "--partitions"},
		{"readers", base("--from", "0", "--to", "1", "--readers", "0"), "--readers"},
		{"dead-letters", base("--from", "0", "--to", "1", "--dead-letters", "ftp://x"), "invalid --dead-letters"},
		{"dlq-topic with a file sink", base("--from", "0", "--to", "1", "--dead-letters", "file:///tmp/x", "--dlq-topic", "d"), "--dlq-topic: it names a Kafka topic"},
		{"dlq-topic read", base("--from", "0", "--to", "1", "--dlq-topic", "bf"), "it is the topic being read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cmdBackfill(t.Context(), tc.args, &stdout, &stderr)
			if code != 2 {
				t.Errorf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 || !strings.Contains(msg, tc.want) {
				t.Errorf("stderr = %q, want one line containing %q", msg, tc.want)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("the refused progress file is gone: %v", err)
	}
}
