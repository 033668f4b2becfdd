package deadletter

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// fileSourceOf writes letters to a new file and opens it as a Source.
func fileSourceOf(t *testing.T, ctx context.Context, letters []Letter) Source {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dlq.jsonl")
	s, err := NewFileSink(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(ctx, letters); err != nil {
		t.Fatal(err)
	}
	src, err := OpenSource(ctx, "file://"+path)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// replayedIDs returns the HeaderReplayedFrom of every record in topic, and
// checks that each replayed record carries its dead letter's key, value and
// headers, on the original's partition.
func replayedIDs(t *testing.T, ctx context.Context, c *kfake.Cluster, topic string, letters []Letter) []string {
	t.Helper()
	byID := make(map[string]Letter)
	for _, l := range letters {
		byID[l.ID()] = l
	}
	var ids []string
	for _, r := range rawRecords(t, ctx, c, topic) {
		id := string(lastHeader(r.Headers, HeaderReplayedFrom))
		ids = append(ids, id)
		l, ok := byID[id]
		if !ok {
			t.Errorf("replayed record %q matches no dead letter", id)
			continue
		}
		n := len(r.Headers)
		want := *l.Record
		want.Headers = append(append([]kgo.RecordHeader{}, l.Record.Headers...), r.Headers[n-2:]...)
		got := *r
		got.Topic, got.Partition, got.Offset, got.Timestamp = want.Topic, want.Partition, want.Offset, want.Timestamp
		if d := diffLetter(Letter{Record: &want}, Letter{Record: &got}); d != "" {
			t.Errorf("replayed %s: %s", id, d)
		}
		if r.Partition != l.Record.Partition {
			t.Errorf("replayed %s to partition %d", id, r.Partition)
		}
		if r.Headers[n-2].Key != HeaderReplayedFrom || r.Headers[n-1].Key != HeaderReplayRun {
			t.Errorf("replayed %s: last headers %q, want the replay markers", id, r.Headers[n-2:])
		}
	}
	return ids
}

func TestDeadLetterReplayOncePerRun(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(6, "orders"))
	cl := newClient(t, c)
	letters := sampleLetters("orders")
	src := fileSourceOf(t, ctx, letters)
	state := filepath.Join(t.TempDir(), "state", "run.journal")

	var events []ReplayEvent
	rep, err := Replay(ctx, src, cl, ReplayRunID("run-1"), ReplayStateFile(state), ReplayBatch(2),
		ReplayFilter(func(l Letter) bool { return l.Class != ClassPanic }),
		ReplayOnLetter(func(e ReplayEvent) { events = append(events, e) }))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Read != 5 || rep.Filtered != 1 || rep.Replayed != 4 || rep.Skipped != 0 {
		t.Fatalf("first run: %+v", rep)
	}
	if len(events) != 4 || events[0].Topic != "orders" || events[0].Partition != 0 {
		t.Fatalf("events: %+v", events)
	}
	if ids := replayedIDs(t, ctx, c, "orders", letters); len(ids) != 4 {
		t.Fatalf("target holds %d records, want 4: %q", len(ids), ids)
	}

	// The same run again sends nothing; the filter widened sends the rest.
	rep, err = Replay(ctx, src, cl, ReplayRunID("run-1"), ReplayStateFile(state),
		ReplayFilter(func(l Letter) bool { return l.Class != ClassPanic }))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 0 || rep.Skipped != 4 {
		t.Fatalf("re-run: %+v", rep)
	}
	rep, err = Replay(ctx, src, cl, ReplayRunID("run-1"), ReplayStateFile(state))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 1 || rep.Skipped != 4 {
		t.Fatalf("widened re-run: %+v", rep)
	}
	ids := replayedIDs(t, ctx, c, "orders", letters)
	seen := map[string]int{}
	for _, id := range ids {
		seen[id]++
	}
	for _, l := range letters {
		if seen[l.ID()] != 1 {
			t.Errorf("%s replayed %d times", l.ID(), seen[l.ID()])
		}
	}
}

// TestDeadLetterReplayRecoversInDoubtBatch: a run died after journaling a
// batch as pending and after the broker took part of it. The re-run finds
// that part in the target by its markers and sends only the rest.
func TestDeadLetterReplayRecoversInDoubtBatch(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(6, "orders"))
	cl := newClient(t, c)
	letters := sampleLetters("orders")
	src := fileSourceOf(t, ctx, letters)
	state := filepath.Join(t.TempDir(), "run.journal")

	// Noise from before the crash: another run's replay of the same
	// letter, and an ordinary record.
	noise := []*kgo.Record{
		{Topic: "orders", Partition: 0, Value: []byte("x"), Headers: []kgo.RecordHeader{
			{Key: HeaderReplayedFrom, Value: []byte(letters[2].ID())}, {Key: HeaderReplayRun, Value: []byte("other-run")}}},
		{Topic: "orders", Partition: 1, Value: []byte("y")},
	}
	if err := cl.ProduceSync(ctx, noise...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// The crashed run: letter 0 journaled as sent; letters 1..3 pending,
	// of which 1 and 3 reached the broker.
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	lines := []journalLine{
		{Run: "r", Op: opPending, IDs: []string{letters[0].ID()}, Ends: offsetMap(ends)},
		{Run: "r", Op: opSent, IDs: []string{letters[0].ID()}},
		{Run: "r", Op: opPending, IDs: []string{letters[1].ID(), letters[2].ID(), letters[3].ID()}, Ends: offsetMap(ends)},
	}
	var buf strings.Builder
	for _, l := range lines {
		b, _ := json.Marshal(l)
		buf.Write(b)
		buf.WriteByte('\n')
	}
	buf.WriteString(`{"run":"r","op":"se`) // torn by the crash
	if err := os.WriteFile(state, []byte(buf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var sent []*kgo.Record
	for _, l := range []Letter{letters[0], letters[1], letters[3]} {
		sent = append(sent, &kgo.Record{Topic: "orders", Partition: l.Record.Partition, Key: l.Record.Key, Value: l.Record.Value,
			Headers: append(append([]kgo.RecordHeader{}, l.Record.Headers...),
				kgo.RecordHeader{Key: HeaderReplayedFrom, Value: []byte(l.ID())},
				kgo.RecordHeader{Key: HeaderReplayRun, Value: []byte("r")})})
	}
	if err := cl.ProduceSync(ctx, sent...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// A dry run tells, and changes nothing.
	before, _ := os.ReadFile(state)
	rep, err := Replay(ctx, src, nil, ReplayRunID("r"), ReplayStateFile(state), ReplayDryRun())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Skipped != 1 || rep.InDoubt != 3 || rep.Replayed != 1 {
		t.Fatalf("dry run: %+v", rep)
	}
	if after, _ := os.ReadFile(state); string(after) != string(before) {
		t.Fatal("dry run changed the state file")
	}

	rep, err = Replay(ctx, src, cl, ReplayRunID("r"), ReplayStateFile(state))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Recovered != 2 || rep.Skipped != 3 || rep.Replayed != 2 {
		t.Fatalf("recovering run: %+v", rep)
	}
	count := map[string]int{}
	for _, r := range rawRecords(t, ctx, c, "orders") {
		if string(lastHeader(r.Headers, HeaderReplayRun)) == "r" {
			count[string(lastHeader(r.Headers, HeaderReplayedFrom))]++
		}
	}
	for _, l := range letters {
		if count[l.ID()] != 1 {
			t.Errorf("%s in the target %d times for run r, want 1", l.ID(), count[l.ID()])
		}
	}
}

func TestDeadLetterReplayLocksItsState(t *testing.T) {
	state := filepath.Join(t.TempDir(), "run.journal")
	j, err := openJournal(state, "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openJournal(state, "r"); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second open = %v, want in use", err)
	}
	j.close()
	j, err = openJournal(state, "r")
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	j.close()
}

func TestDeadLetterReplayChecksItsSetup(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(1, "orders"))
	src := fileSourceOf(t, ctx, sampleLetters("orders"))
	state := filepath.Join(t.TempDir(), "j")
	sticky := newClient(t, c, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	for name, opts := range map[string][]ReplayOpt{
		"no run id":     {ReplayStateFile(state)},
		"bad run id":    {ReplayRunID("a/b"), ReplayStateFile(state)},
		"no state":      {ReplayRunID("r")},
		"sticky":        {ReplayRunID("r"), ReplayStateFile(state)},
		"missing topic": {ReplayRunID("r"), ReplayStateFile(state), ReplayTo("nope")},
	} {
		cl := newClient(t, c)
		if name == "sticky" {
			cl = sticky
		}
		if _, err := Replay(ctx, src, cl, opts...); err == nil {
			t.Errorf("%s: Replay succeeded", name)
		}
	}
}
