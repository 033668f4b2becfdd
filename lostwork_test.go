package kpar

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/kpar/kpar/internal/offsetmeta"
)

// TestLostWorkJoinsTheCommittedFinishedSet: what a member finished on a
// partition it lost joins the finished set of the commit metadata when the
// partition comes back, above the committed offset only, and only once.
func TestLostWorkJoinsTheCommittedFinishedSet(t *testing.T) {
	k := tp{topic: "t", partition: 1}
	var l lostWork
	l.keep(k, []offsetmeta.Run{{From: 100, To: 250}, {From: 260, To: 270}})
	meta := []offsetmeta.Run{{From: 121, To: 130}, {From: 280, To: 290}}
	got := l.take(k, meta, 120)
	want := []offsetmeta.Run{{From: 120, To: 250}, {From: 260, To: 270}, {From: 280, To: 290}}
	if !slices.Equal(got, want) {
		t.Errorf("take = %v, want %v", got, want)
	}
	if got := l.take(k, meta, 120); !slices.Equal(got, meta) {
		t.Errorf("second take = %v, want the metadata's %v alone", got, meta)
	}
	l.keep(k, []offsetmeta.Run{{From: 0, To: 10}})
	l.forget("t")
	if got := l.take(k, nil, 0); got != nil {
		t.Errorf("take after forget = %v, want nothing", got)
	}
	l.keep(k, []offsetmeta.Run{{From: 0, To: 10}})
	if got := l.take(k, nil, 50); len(got) != 0 {
		t.Errorf("take above what was kept = %v, want nothing", got)
	}
}

// TestAWindowOfRecordsFinishedBeforeStillRefills: records the commit
// metadata (or work kept from a lost assignment) says were finished enter
// the window done, without running. When a whole window's worth of them
// entered after the last record that ran, nothing of the partition ran
// any more to move its held records in: the partition stalled with every
// record after them held (issue 35's broker-restart stall, where the first
// window after each reassignment was work finished before the loss). The
// records after them must be handled.
func TestAWindowOfRecordsFinishedBeforeStillRefills(t *testing.T) {
	const n, window = 200, 10
	c := newFakeCluster(t, notPorted, "refill", 1)
	l := invariant.New(invariant.ByKey, 0)
	produce(t, c, "refill", n, n, l.Produced)
	// Committed at 0 with 1..119 finished: record 0 runs, then twelve
	// windows' worth of records enter done.
	finished := []offsetmeta.Run{{From: 1, To: 120}}
	meta, covered := offsetmeta.Encode(ByKey.metaMode(), 0, finished, 4096)
	if covered != 1 {
		t.Fatalf("the metadata covers %d runs, want 1", covered)
	}
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: "refill", Partition: 0, At: 0, LeaderEpoch: -1, Metadata: meta})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if resp, err := adminClient(t, c).CommitOffsets(ctx, "refill", os); err != nil || resp.Error() != nil {
		t.Fatalf("pre-commit: %v %v", err, resp.Error())
	}

	want := int64(1 + n - 120)
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error { l.Handled(r); return nil })
	cons, err := New(h, append(testOpts(c, "refill", "refill"), WindowRecords(window))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, l.Reached(want), 30*time.Second, "record 0 and every record after the finished ones")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rep := l.Report(); rep.Handled != want || rep.Duplicates != 0 {
		t.Fatalf("%+v, want %d handled once each", rep, want)
	}
}
