package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/deadletter/pgsink"

	"github.com/kpar/kpar/internal/testkit"
)

// dlqCtx bounds one test; nothing in these tests sleeps.
func dlqCtx(t *testing.T) context.Context { return testkit.Context(t, 90*time.Second) }

// runDLQ runs `kpar dlq ARGS...` in process.
func runDLQ(t *testing.T, ctx context.Context, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cmdDLQ(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// mustDLQ runs a dlq command that must succeed.
func mustDLQ(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	code, out, errs := runDLQ(t, ctx, args...)
	if code != 0 {
		t.Fatalf("kpar dlq %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

func dlqTS(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// dlqLetters: five dead letters of topic orders (three partitions), two of
// them with messages that differ only in a number.
func dlqLetters() []deadletter.Letter {
	mk := func(p int32, o int64, class deadletter.Class, msg, last string) deadletter.Letter {
		return deadletter.Letter{
			Record: &kgo.Record{Topic: "orders", Partition: p, Offset: o,
				Key: []byte("key-" + string(rune('a'+o))), Value: []byte{0, 1, 2, byte(o)},
				Headers:   []kgo.RecordHeader{{Key: "trace", Value: []byte("t")}, {Key: "bin", Value: []byte{0xff, 0}}},
				Timestamp: dlqTS("2024-05-01T00:00:00Z")},
			Group: "billing", Class: class, Message: msg, Attempts: 3,
			FirstFailure: dlqTS(last).Add(-time.Minute), LastFailure: dlqTS(last),
		}
	}
	return []deadletter.Letter{
		mk(0, 1, deadletter.ClassExhausted, "charge failed: card 1234 declined", "2024-05-01T10:00:00Z"),
		mk(0, 2, deadletter.ClassExhausted, "charge failed: card 9876 declined", "2024-05-02T10:00:00Z"),
		mk(1, 5, deadletter.ClassPermanent, "invalid json at byte 17", "2024-05-03T10:00:00Z"),
		mk(2, 9, deadletter.ClassTimeout, "attempt timed out (request 123e4567-e89b-12d3-a456-426614174000)", "2024-05-04T10:00:00Z"),
		mk(1, 6, deadletter.ClassPanic, "panic: boom\n\ngoroutine 9 [running]:\nmain.handle()", "2024-05-05T10:00:00Z"),
	}
}

// dlqEnv is a source of dead letters and a Kafka cluster to replay to.
type dlqEnv struct {
	source       string // --source
	brokers      string // the cluster's address
	needsBrokers bool   // the source is not Kafka: replay needs --brokers
	cluster      *kfake.Cluster
}

type dlqSourceCase struct {
	name string
	// setup stores letters in a new source and returns its URL.
	setup func(t *testing.T, ctx context.Context, c *kfake.Cluster, letters []deadletter.Letter) (source string)
}

func dlqSourceCases() []dlqSourceCase {
	return []dlqSourceCase{
		{"kafka", func(t *testing.T, ctx context.Context, c *kfake.Cluster, letters []deadletter.Letter) string {
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := deadletter.NewKafkaSink(cl).Write(ctx, letters); err != nil {
				t.Fatal(err)
			}
			return "kafka://" + strings.Join(c.ListenAddrs(), ",") + "/orders.dlq"
		}},
		{"file", func(t *testing.T, ctx context.Context, c *kfake.Cluster, letters []deadletter.Letter) string {
			path := filepath.Join(t.TempDir(), "dlq.jsonl")
			s, err := deadletter.NewFileSink(path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Write(ctx, letters); err != nil {
				t.Fatal(err)
			}
			return "file://" + path
		}},
		{"postgres", func(t *testing.T, ctx context.Context, c *kfake.Cluster, letters []deadletter.Letter) string {
			dsn := os.Getenv("KPAR_TEST_POSTGRES")
			if dsn == "" {
				t.Skip("KPAR_TEST_POSTGRES is unset: set it to a PostgreSQL DSN (scripts/test.sh starts a server and sets it)")
			}
			b := make([]byte, 4)
			rand.Read(b)
			table := "dlq_cli_" + hex.EncodeToString(b)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if conn, err := pgx.Connect(ctx, dsn); err == nil {
					conn.Exec(ctx, "DROP TABLE IF EXISTS "+table)
					conn.Close(ctx)
				}
			})
			s, err := pgsink.Open(ctx, dsn, pgsink.Table(table))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Write(ctx, letters); err != nil {
				t.Fatal(err)
			}
			u, _ := url.Parse(dsn)
			q := u.Query()
			q.Set(pgsink.TableParam, table)
			u.RawQuery = q.Encode()
			return u.String()
		}},
	}
}

// newDLQEnv starts a cluster with the topics the tests use and fills the
// source with dlqLetters, or letters when given.
func newDLQEnv(t *testing.T, ctx context.Context, sc dlqSourceCase, letters ...deadletter.Letter) dlqEnv {
	t.Helper()
	if letters == nil {
		letters = dlqLetters()
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders", "orders.dlq", "replayed"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	src := sc.setup(t, ctx, c, letters)
	return dlqEnv{source: src, brokers: strings.Join(c.ListenAddrs(), ","), needsBrokers: sc.name != "kafka", cluster: c}
}

// topicRecords reads every record of topic as stored.
func topicRecords(t *testing.T, ctx context.Context, env dlqEnv, topic string) []*kgo.Record {
	t.Helper()
	src, err := deadletter.OpenSource(ctx, "kafka://"+env.brokers+"/"+topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []*kgo.Record
	if err := src.Read(ctx, func(l deadletter.Letter) error {
		out = append(out, l.Record) // plain records decode as themselves
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func nonEmptyLines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			out = append(out, sc.Text())
		}
	}
	return out
}

// letterLines are the lines of `kpar dlq list` that start a letter: not
// the indented lines of its value under it.
func letterLines(s string) []string {
	var out []string
	for _, l := range nonEmptyLines(s) {
		if !strings.HasPrefix(l, " ") {
			out = append(out, l)
		}
	}
	return out
}

func TestDLQStats(t *testing.T) {
	for _, sc := range dlqSourceCases() {
		t.Run(sc.name, func(t *testing.T) {
			ctx := dlqCtx(t)
			env := newDLQEnv(t, ctx, sc)

			out := mustDLQ(t, ctx, "stats", "--source", env.source)
			for _, want := range []string{
				"dead letters: 5\n",
				"oldest last failure: 2024-05-01T10:00:00.000Z\n",
				"newest last failure: 2024-05-05T10:00:00.000Z\n",
				"        2  exhausted\n",
				"        1  panic\n",
				"        2  charge failed: card <n> declined\n",
				"        1  attempt timed out (request <uuid>)\n",
				"        1  invalid json at byte <n>\n",
				"        1  panic: boom\n",
				"        2  orders/0\n",
				"        2  orders/1\n",
				"        1  orders/2\n",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("stats output lacks %q:\n%s", want, out)
				}
			}

			var rep dlqStatsReport
			out = mustDLQ(t, ctx, "stats", "--source", env.source, "--json")
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("stats --json: %v\n%s", err, out)
			}
			if rep.Total != 5 || rep.ByClass["exhausted"] != 2 || rep.ByClass["timeout"] != 1 ||
				len(rep.ByMessage) != 4 || rep.ByMessage[0].Count != 2 || rep.ByMessage[0].Message != "charge failed: card <n> declined" ||
				len(rep.ByPartition) != 3 || rep.ByPartition[0].Topic != "orders" || *rep.ByPartition[0].Partition != 0 ||
				!rep.OldestLastFailure.Equal(dlqTS("2024-05-01T10:00:00Z")) || !rep.NewestLastFailure.Equal(dlqTS("2024-05-05T10:00:00Z")) {
				t.Errorf("stats --json: %+v", rep)
			}

			out = mustDLQ(t, ctx, "stats", "--source", env.source, "--error-class", "permanent")
			if !strings.Contains(out, "dead letters: 1\n") {
				t.Errorf("stats --error-class permanent:\n%s", out)
			}
		})
	}
}

func TestDLQList(t *testing.T) {
	for _, sc := range dlqSourceCases() {
		t.Run(sc.name, func(t *testing.T) {
			ctx := dlqCtx(t)
			env := newDLQEnv(t, ctx, sc)

			lines := letterLines(mustDLQ(t, ctx, "list", "--source", env.source))
			if len(lines) != 5 {
				t.Fatalf("list printed %d lines:\n%s", len(lines), strings.Join(lines, "\n"))
			}
			var joined = strings.Join(lines, "\n")
			for _, want := range []string{
				"2024-05-01T10:00:00.000Z  exhausted  orders/0/1  attempts=3  group=billing  charge failed: card 1234 declined",
				"2024-05-05T10:00:00.000Z  panic      orders/1/6  attempts=3  group=billing  panic: boom",
			} {
				if !strings.Contains(joined, want) {
					t.Errorf("list lacks %q:\n%s", want, joined)
				}
			}

			for _, tc := range []struct {
				args []string
				want int
			}{
				{[]string{"--limit", "2"}, 2},
				{[]string{"--error-class", "exhausted"}, 2},
				{[]string{"--since", "2024-05-02T10:00:00Z"}, 4},
				{[]string{"--since", "2024-05-03T00:00:00Z", "--error-class", "timeout"}, 1},
				{[]string{"--since", "1h"}, 0},
				{[]string{"--since", "87600h"}, 5},
			} {
				args := append([]string{"list", "--source", env.source}, tc.args...)
				if got := len(letterLines(mustDLQ(t, ctx, args...))); got != tc.want {
					t.Errorf("list %s: %d lines, want %d", strings.Join(tc.args, " "), got, tc.want)
				}
			}

			// --json is the file sink's format: it reads back as a source,
			// byte-for-byte.
			out := mustDLQ(t, ctx, "list", "--source", env.source, "--json")
			path := filepath.Join(t.TempDir(), "copy.jsonl")
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			src, err := deadletter.OpenSource(ctx, "file://"+path)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]deadletter.Letter{}
			for _, l := range dlqLetters() {
				want[l.ID()] = l
			}
			n := 0
			src.Read(ctx, func(l deadletter.Letter) error {
				n++
				w := want[l.ID()]
				if w.Record == nil || !bytes.Equal(w.Record.Key, l.Record.Key) || !bytes.Equal(w.Record.Value, l.Record.Value) ||
					len(l.Record.Headers) != 2 || !bytes.Equal(l.Record.Headers[1].Value, []byte{0xff, 0}) ||
					w.Message != l.Message || !w.LastFailure.Equal(l.LastFailure) || !w.Record.Timestamp.Equal(l.Record.Timestamp) {
					t.Errorf("list --json changed %s: %+v %+v", l.ID(), l, l.Record)
				}
				return nil
			})
			if n != 5 {
				t.Errorf("list --json wrote %d letters", n)
			}
		})
	}
}

// TestDLQGroups: one source holds the same five records dead-lettered by
// two groups (issue 29: stats said 5 and list showed one group). stats
// counts 5 per group and 10 in all, list prints all 10, both say on stderr
// that two groups were merged, --group picks one, and replay sends each
// record once.
func TestDLQGroups(t *testing.T) {
	for _, sc := range dlqSourceCases() {
		t.Run(sc.name, func(t *testing.T) {
			ctx := dlqCtx(t)
			letters := dlqLetters()
			for _, l := range dlqLetters() {
				l.Group = "audit"
				letters = append(letters, l)
			}
			env := newDLQEnv(t, ctx, sc, letters...)
			const merged = "dead letters of 2 groups merged: audit (5), billing (5); pass --group G for one group's\n"

			code, out, errs := runDLQ(t, ctx, "stats", "--source", env.source)
			if code != 0 || !strings.Contains(out, "dead letters: 10\n") || !strings.Contains(out, "by group:\n        5  audit\n        5  billing\n") {
				t.Errorf("stats: exit %d\n%s", code, out)
			}
			if errs != "kpar dlq stats: "+merged {
				t.Errorf("stats stderr = %q, want the merge named", errs)
			}
			var rep dlqStatsReport
			if err := json.Unmarshal([]byte(mustDLQ(t, ctx, "stats", "--source", env.source, "--json")), &rep); err != nil {
				t.Fatal(err)
			}
			if rep.Total != 10 || len(rep.ByGroup) != 2 || rep.ByGroup["audit"] != 5 || rep.ByGroup["billing"] != 5 {
				t.Errorf("stats --json: total %d, by group %v", rep.Total, rep.ByGroup)
			}

			code, out, errs = runDLQ(t, ctx, "stats", "--source", env.source, "--group", "audit")
			if code != 0 || !strings.Contains(out, "dead letters: 5\n") || strings.Contains(out, "billing") || errs != "" {
				t.Errorf("stats --group audit: exit %d, stderr %q\n%s", code, errs, out)
			}

			code, out, errs = runDLQ(t, ctx, "list", "--source", env.source)
			lines := letterLines(out)
			if code != 0 || len(lines) != 10 || strings.Count(out, "group=audit") != 5 || strings.Count(out, "group=billing") != 5 {
				t.Errorf("list: exit %d, %d lines\n%s", code, len(lines), out)
			}
			if errs != "kpar dlq list: "+merged {
				t.Errorf("list stderr = %q, want the merge named", errs)
			}
			code, out, errs = runDLQ(t, ctx, "list", "--source", env.source, "--group", "billing")
			if code != 0 || len(letterLines(out)) != 5 || strings.Contains(out, "group=audit") || errs != "" {
				t.Errorf("list --group billing: exit %d, stderr %q\n%s", code, errs, out)
			}

			// Replaying both groups' letters sends each record once.
			state := t.TempDir()
			code, out, errs = runDLQ(t, ctx, replayArgs(env, state, "--to", "replayed")...)
			if code != 0 || !strings.Contains(out, "replayed 5,") || !strings.Contains(out, "same record as another group's letter 5,") ||
				!strings.Contains(errs, "dead letters of 2 groups merged") {
				t.Errorf("replay: exit %d, stderr %q\n%s", code, errs, out)
			}
			checkReplayed(t, ctx, env, "replayed", []string{"orders/0/1", "orders/0/2", "orders/1/5", "orders/1/6", "orders/2/9"})
		})
	}
}

// TestDLQListShowsCutLetters: a letter the Kafka sink had to cut says so
// in list, and replay leaves it out, saying why.
func TestDLQListShowsCutLetters(t *testing.T) {
	ctx := dlqCtx(t)
	letters := dlqLetters()
	r := letters[2].Record
	r.Value = nil
	r.Headers = append(r.Headers,
		kgo.RecordHeader{Key: deadletter.HeaderValueTruncated, Value: []byte("true")},
		kgo.RecordHeader{Key: deadletter.HeaderValueOriginalBytes, Value: []byte("5242880")})
	env := newDLQEnv(t, ctx, dlqSourceCases()[1], letters...) // file
	out := mustDLQ(t, ctx, "list", "--source", env.source)
	if !strings.Contains(out, "orders/1/5  attempts=3  group=billing  cut=value  invalid json") || strings.Count(out, "cut=") != 1 {
		t.Errorf("list does not mark the cut letter alone:\n%s", out)
	}
	code, out, errs := runDLQ(t, ctx, replayArgs(env, t.TempDir(), "--to", "replayed")...)
	if code != 0 || !strings.Contains(out, "replayed 4,") || !strings.Contains(out, "cut by the sink 1,") || !strings.Contains(errs, "1 dead letters were too large") {
		t.Errorf("replay: exit %d, stderr %q\n%s", code, errs, out)
	}
}

// TestDLQListShowsValues: list shows each letter's value under its line
// without --json (issue 37: values only as base64 and only with --json):
// JSON pretty-printed, UTF-8 text as it is, anything else as base64 with
// its size, a value too long cut with a note; --json still prints the
// file sink's lines, the value base64 there.
func TestDLQListShowsValues(t *testing.T) {
	ctx := dlqCtx(t)
	letters := dlqLetters()
	letters[0].Record.Value = []byte(`{"order":17,"items":[{"sku":"A-1","qty":2}],"note":"ünïcode"}`)
	letters[1].Record.Value = []byte("charge card 1234\nsecond line")
	letters[2].Record.Value = []byte{0, 1, 2, 0xff}                 // binary
	letters[3].Record.Value = []byte("esc \x1b[2J clears a screen") // a control: not shown raw
	letters[4].Record.Value = bytes.Repeat([]byte("x"), 5000)
	env := newDLQEnv(t, ctx, dlqSourceCases()[1], letters...) // file
	out := mustDLQ(t, ctx, "list", "--source", env.source)
	for _, want := range []string{
		"orders/0/1  attempts=3  group=billing  charge failed: card 1234 declined\n" +
			"    value (json):\n" +
			"      {\n" +
			"        \"order\": 17,\n" +
			"        \"items\": [\n" +
			"          {\n" +
			"            \"sku\": \"A-1\",\n",
		"        \"note\": \"ünïcode\"\n      }\n",
		"orders/0/2  attempts=3  group=billing  charge failed: card 9876 declined\n" +
			"    value (text):\n      charge card 1234\n      second line\n",
		"invalid json at byte 17\n    value (4 bytes, not UTF-8 text; base64): AAEC/w==\n",
		"value (24 bytes, not UTF-8 text; base64): ZXNjIBtbMkogY2xlYXJzIGEgc2NyZWVu\n",
		"value (text):\n      xxxx",
		"xxx ... (904 more bytes; --json prints the whole value)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	if n := len(letterLines(out)); n != 5 {
		t.Errorf("%d unindented lines, want one per letter (5):\n%s", n, out)
	}
	js := mustDLQ(t, ctx, "list", "--source", env.source, "--json")
	lines := nonEmptyLines(js)
	if len(lines) != 5 {
		t.Fatalf("list --json printed %d lines, want 5:\n%s", len(lines), js)
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) || strings.Contains(l, "value (") {
			t.Errorf("list --json line is not one JSON object: %s", l)
		}
	}
	if !strings.Contains(js, "AAEC/w==") {
		t.Errorf("list --json lacks the binary value in base64:\n%s", js)
	}
}

// replayArgs is `kpar dlq replay` against env, with its own state dir.
func replayArgs(env dlqEnv, stateDir string, extra ...string) []string {
	args := []string{"replay", "--source", env.source, "--state-dir", stateDir}
	if env.needsBrokers {
		args = append(args, "--brokers", env.brokers)
	}
	return append(args, extra...)
}

func TestDLQReplay(t *testing.T) {
	for _, sc := range dlqSourceCases() {
		t.Run(sc.name, func(t *testing.T) {
			ctx := dlqCtx(t)
			env := newDLQEnv(t, ctx, sc)
			state := t.TempDir()

			// A dry run prints the plan and sends and writes nothing.
			out := mustDLQ(t, ctx, replayArgs(env, state, "--dry-run", "--to", "replayed", "--error-class", "exhausted")...)
			if n := strings.Count(out, "would replay"); n != 2 || !strings.Contains(out, "orders/0/2 -> replayed[0]") ||
				!strings.Contains(out, "dry run replay-") || !strings.Contains(out, "2 would be replayed") {
				t.Errorf("dry run output:\n%s", out)
			}
			if recs := topicRecords(t, ctx, env, "replayed"); len(recs) != 0 {
				t.Fatalf("dry run sent %d records", len(recs))
			}
			if entries, _ := os.ReadDir(state); len(entries) != 0 {
				t.Fatalf("dry run wrote %d state files", len(entries))
			}

			// The filtered replay sends the two exhausted letters.
			out = mustDLQ(t, ctx, replayArgs(env, state, "--to", "replayed", "--error-class", "exhausted")...)
			if !strings.Contains(out, "replayed 2, already replayed 0") {
				t.Errorf("replay output:\n%s", out)
			}
			checkReplayed(t, ctx, env, "replayed", []string{"orders/0/1", "orders/0/2"})

			// The same command again sends nothing.
			out = mustDLQ(t, ctx, replayArgs(env, state, "--to", "replayed", "--error-class", "exhausted")...)
			if !strings.Contains(out, "replayed 0, already replayed 2") {
				t.Errorf("re-run output:\n%s", out)
			}
			checkReplayed(t, ctx, env, "replayed", []string{"orders/0/1", "orders/0/2"})
			out = mustDLQ(t, ctx, replayArgs(env, state, "--dry-run", "--to", "replayed", "--error-class", "exhausted")...)
			if !strings.Contains(out, "0 would be replayed, 2 already replayed") {
				t.Errorf("dry run after the replay:\n%s", out)
			}

			// Everything to the original topic is another run: all five,
			// on their original partitions; then again, nothing.
			mustDLQ(t, ctx, replayArgs(env, state)...)
			all := []string{"orders/0/1", "orders/0/2", "orders/1/5", "orders/1/6", "orders/2/9"}
			checkReplayed(t, ctx, env, "orders", all)
			out = mustDLQ(t, ctx, replayArgs(env, state)...)
			if !strings.Contains(out, "replayed 0, already replayed 5") {
				t.Errorf("re-run output:\n%s", out)
			}
			checkReplayed(t, ctx, env, "orders", all)

			// A new run id is a new replay.
			mustDLQ(t, ctx, replayArgs(env, state, "--run-id", "again", "--error-class", "timeout")...)
			if n := len(topicRecords(t, ctx, env, "orders")); n != 6 {
				t.Errorf("orders holds %d records after a second run, want 6", n)
			}
		})
	}
}

// checkReplayed checks that topic holds exactly one replayed record per id,
// each a faithful copy of its dead letter on the original partition.
func checkReplayed(t *testing.T, ctx context.Context, env dlqEnv, topic string, ids []string) {
	t.Helper()
	want := map[string]deadletter.Letter{}
	for _, l := range dlqLetters() {
		want[l.ID()] = l
	}
	var got []string
	for _, r := range topicRecords(t, ctx, env, topic) {
		n := len(r.Headers)
		if n < 2 || r.Headers[n-2].Key != deadletter.HeaderReplayedFrom || r.Headers[n-1].Key != deadletter.HeaderReplayRun {
			t.Errorf("record %s/%d/%d lacks the replay headers: %q", r.Topic, r.Partition, r.Offset, r.Headers)
			continue
		}
		id := string(r.Headers[n-2].Value)
		got = append(got, id)
		l, ok := want[id]
		if !ok {
			t.Errorf("replayed %q is no dead letter", id)
			continue
		}
		if r.Partition != l.Record.Partition || !bytes.Equal(r.Key, l.Record.Key) || !bytes.Equal(r.Value, l.Record.Value) {
			t.Errorf("replayed %s: partition %d key %q value %x", id, r.Partition, r.Key, r.Value)
		}
		if len(r.Headers) != len(l.Record.Headers)+2 || r.Headers[0].Key != "trace" || !bytes.Equal(r.Headers[1].Value, []byte{0xff, 0}) {
			t.Errorf("replayed %s: headers %q", id, r.Headers)
		}
	}
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(ids, " ") {
		t.Errorf("%s holds replays of %q, want %q", topic, got, ids)
	}
}

func TestDLQUsageErrors(t *testing.T) {
	ctx := dlqCtx(t)
	file := filepath.Join(t.TempDir(), "dlq.jsonl")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	src := "file://" + file
	for _, tc := range []struct {
		args []string
		want string // in the one-line error
	}{
		{[]string{}, "usage: kpar dlq"},
		{[]string{"bogus"}, `unknown subcommand "bogus"`},
		{[]string{"stats"}, "--source"},
		{[]string{"stats", "--source", "ftp://host/x"}, "--source"},
		{[]string{"stats", "--source", src, "--error-class", "fatal"}, "--error-class"},
		{[]string{"list", "--source", src, "--since", "yesterday"}, "--since"},
		{[]string{"list", "--source", src, "--limit", "-1"}, "--limit"},
		{[]string{"list", "--source", src, "--limit", "many"}, "-limit"},
		{[]string{"list", "--nope"}, "-nope"},
		{[]string{"list", "--source", src, "extra"}, `unexpected argument "extra"`},
		{[]string{"replay", "--source", src, "--state-dir", t.TempDir()}, "--brokers"},
		{[]string{"replay", "--source", src, "--brokers", "nohostport", "--state-dir", t.TempDir()}, "--brokers"},
		{[]string{"replay", "--source", src, "--brokers", "127.0.0.1:1", "--run-id", "a/b"}, "--run-id"},
		{[]string{"stats", "--source", src, "--sasl-mechanism", "kerberos"}, "sasl"},
	} {
		code, out, errs := runDLQ(t, ctx, tc.args...)
		if code != 2 {
			t.Errorf("kpar dlq %q: exit %d, want 2\nstdout: %s\nstderr: %s", tc.args, code, out, errs)
			continue
		}
		if len(tc.args) > 0 && (strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, tc.want)) {
			t.Errorf("kpar dlq %q: stderr %q, want one line naming %q", tc.args, errs, tc.want)
		}
		if len(tc.args) == 0 && !strings.Contains(errs, tc.want) {
			t.Errorf("kpar dlq: stderr %q", errs)
		}
	}

	// Help is not an error.
	if code, _, errs := runDLQ(t, ctx, "replay", "--help"); code != 0 || !strings.Contains(errs, "once per run id") {
		t.Errorf("replay --help: exit %d, help does not explain re-runs:\n%s", code, errs)
	}
	if code, out, _ := runDLQ(t, ctx, "--help"); code != 0 || !strings.Contains(out, "replay") {
		t.Errorf("dlq --help: exit %d\n%s", code, out)
	}
	// A source that cannot be read is a failure, not a usage error.
	if code, _, errs := runDLQ(t, ctx, "stats", "--source", "file://"+filepath.Join(t.TempDir(), "missing")); code != 1 || !strings.HasPrefix(errs, "kpar dlq stats: ") {
		t.Errorf("missing file: exit %d, stderr %q", code, errs)
	}
	// Flags also come from KPAR_<FLAG>.
	t.Setenv("KPAR_SOURCE", src)
	if out := mustDLQ(t, ctx, "stats"); !strings.Contains(out, "dead letters: 0") {
		t.Errorf("stats from KPAR_SOURCE:\n%s", out)
	}
	t.Setenv("KPAR_ERROR_CLASS", "nope")
	if code, _, errs := runDLQ(t, ctx, "stats"); code != 2 || !strings.Contains(errs, "KPAR_ERROR_CLASS") && !strings.Contains(errs, "--error-class") {
		t.Errorf("bad KPAR_ERROR_CLASS: exit %d, stderr %q", code, errs)
	}
}

func TestDLQNormalisesMessages(t *testing.T) {
	for in, want := range map[string]string{
		"charge failed: card 1234 declined":                      "charge failed: card <n> declined",
		"  user 550e8400-e29b-41d4-a716-446655440000 not found ": "user <uuid> not found",
		"bad pointer 0xc000123abc in frame 3":                    "bad pointer <hex> in frame <n>",
		"object deadbeef42 missing; trace 9f86d081884c7d65":      "object <hex> missing; trace <hex>",
		"decoding failed\n\tat line 3":                           "decoding failed",
		"panic: boom\n\ngoroutine 1 [running]:":                  "panic: boom",
		"":                                                       "(no message)",
		"tabs\tand   spaces":                                     "tabs and spaces",
		"facade":                                                 "facade",
	} {
		if got := dlqNormalise(in); got != want {
			t.Errorf("dlqNormalise(%q) = %q, want %q", in, got, want)
		}
	}
}
