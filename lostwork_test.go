package kpar

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/kpar/kpar/internal/offsetmeta"
	"github.com/kpar/kpar/internal/window"
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

// TestAMemberLostTwiceBeforeACommitLandsKeepsWhatItFinished: a member that
// loses its partitions (the broker forgot it: fenced), gets them back and
// finishes more records, then loses them again before any commit of the
// new assignment landed, keeps all it finished for when they come back the
// second time. It kept only what lay above its own last commit or the
// committed offset read at assignment, and the first fetch forgets the
// latter: the second loss kept nothing and every record since the last
// commit that landed ran again (issue 35: kill -9 restarts of kpar broker
// under a consumer-protocol member, thousands of duplicates, the committed
// offset seemingly back where it was two restarts earlier).
func TestAMemberLostTwiceBeforeACommitLandsKeepsWhatItFinished(t *testing.T) {
	const topic, group, keys = "lost-twice", "lost-twice", 10
	c := newFakeCluster(t, "fences the member and refuses its commits", topic, 1)
	l := invariant.New(invariant.ByKey, 0)
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error { l.Handled(r); return nil })
	rebalances := &rebalanceSignal{assigned: make(chan struct{}, 8), lost: make(chan struct{}, 8)}
	commitHook, commits := commitSignal()
	cons, err := New(h, append(testOpts(c, group, topic), GroupProtocol(ConsumerProtocol), WithHooks(rebalances, commitHook))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	produced := 0
	produceTo := func(n int) {
		t.Helper()
		produceRange(t, c, topic, produced, n, keys, l.Produced)
		produced = n
		waitFor(t, l.Reached(int64(n)), 30*time.Second, fmt.Sprintf("records up to %d handled", n))
	}
	produceTo(100)
	waitPartition(t, cons, commits, "the first 100 records committed", func(s PartitionStats) bool { return s.Committed == 100 })
	await(t, rebalances.assigned, "the first assignment")

	refused := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.UnknownMemberID, Count: -1})
	fence := func(what string) {
		t.Helper()
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ConsumerGroupHeartbeat}, Group: group, Err: kerr.FencedMemberEpoch})
		await(t, rebalances.lost, what+": partitions lost")
		await(t, rebalances.assigned, what+": partitions assigned again")
	}
	produceTo(300)
	fence("first fence") // kept: 100 to 300, above its own last commit
	produceTo(500)       // 100 to 300 skipped, 300 to 500 handled; no commit lands
	fence("second fence")
	produceTo(550) // after 100 to 500, finished before and kept, come again

	refused.Remove()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rep := l.Report(); rep.Duplicates != 0 || rep.Lost != 0 || rep.Handled != 550 {
		t.Fatalf("%+v, want 550 records handled once each", rep)
	}
}

// rebalanceSignal signals each assignment and each loss of partitions.
type rebalanceSignal struct{ assigned, lost chan struct{} }

func (s *rebalanceSignal) OnPartitionsAssigned(assigned map[string][]int32) {
	if len(assigned) > 0 {
		s.assigned <- struct{}{}
	}
}

func (s *rebalanceSignal) OnPartitionsRevoked(_ map[string][]int32, lost bool) {
	if lost {
		s.lost <- struct{}{}
	}
}

// await waits for one signal on ch, failing the test after 30s.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	waitFor(t, ch, 30*time.Second, what)
}

// TestALostPartitionKeepsFinishedOffsetsNotFetchedAgainYet: the finished
// offsets read at assignment (the commit metadata, work kept from an
// earlier loss) whose records were not fetched again before the partition
// was lost once more are still finished, and kept.
func TestALostPartitionKeepsFinishedOffsetsNotFetchedAgainYet(t *testing.T) {
	ps := &partState{win: window.New(8), committed: -1, resumeAt: 100, firstAdmitted: -1,
		skip: []offsetmeta.Run{{From: 100, To: 300}, {From: 310, To: 320}}}
	want := []offsetmeta.Run{{From: 100, To: 300}, {From: 310, To: 320}}
	if got := finishedOf(ps); !slices.Equal(got, want) {
		t.Errorf("nothing fetched yet: finishedOf = %v, want %v", got, want)
	}
}
