package main

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/internal/testkit"
)

// fakeUnowned is the partitions this member does not own, as a test sets
// them.
type fakeUnowned struct {
	mu    sync.Mutex
	parts []unownedPart
	fails bool
}

func (f *fakeUnowned) set(fails bool, parts ...unownedPart) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parts, f.fails = parts, fails
}

func (f *fakeUnowned) list() ([]unownedPart, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.parts, !f.fails
}

// TestReadinessSeesPartitionsNobodyFinishes: a member idle with nothing of
// its own waiting is not ready while another member's partition has lag
// and its commit does not move for the grace (a killed member keeps its
// partitions until its session times out), and the message names the
// partition; a commit that moves, a partition caught up, or a listing that
// fails (unknown) makes it ready again. In virtual time.
func TestReadinessSeesPartitionsNobodyFinishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		others := &fakeUnowned{}
		others.set(false, unownedPart{topic: "t", partition: 2, lag: 100, committed: "5 "}, unownedPart{topic: "t", partition: 3, lag: 0, committed: "9 "})
		s := startWatch(t, 2*time.Second, &fakeWork{unowned: others})

		wantReady(t, s, "another member's partition with lag, just seen")
		wait(3 * time.Second)
		wantNotReady(t, s, "its commit unmoved for the grace", "100 records waiting on partitions this member does not own (t/2)", "session times out")

		others.set(false, unownedPart{topic: "t", partition: 2, lag: 90, committed: "15 "})
		wait(2 * time.Second)
		wantReady(t, s, "its commit moved")
		wait(2 * time.Second)
		wantNotReady(t, s, "its commit unmoved again for the grace", "90 records", "(t/2)")

		others.set(false, unownedPart{topic: "t", partition: 2, lag: 0, committed: "15 "})
		wait(2 * time.Second)
		wantReady(t, s, "the partition caught up")

		others.set(false, unownedPart{topic: "t", partition: 2, lag: 7, committed: "15 "})
		wait(4 * time.Second)
		wantNotReady(t, s, "new records, no commit", "7 records")
		others.set(true)
		wait(2 * time.Second)
		wantReady(t, s, "the listing failed: unknown is not stalled")
	})
}

// TestStallWatchListsUnownedPartitions: the listing names the consumed
// topic's partitions the member does not own, with their lag from the
// group's commit (from the log's start where nothing is committed).
func TestStallWatchListsUnownedPartitions(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	c := testkit.Cluster(t, kfake.SeedTopics(3, "t"))
	s := newStallWatch(time.Minute)
	if s.list(ctx, nil).unownedKnown {
		t.Error("listing known before the Consumer has a client")
	}
	offsets := make(kadm.Offsets)
	offsets.Add(kadm.Offset{Topic: "t", Partition: 1, At: 1, Metadata: "a"})
	cl := lagGroup(ctx, t, c, s, 3, 12, offsets)
	// Partition 0 is this member's; 1: 4 records, committed at 1; 2: 4, none committed.
	l := s.list(ctx, []kpar.PartitionStats{{Topic: "t", Partition: 0}})
	if !l.unownedKnown {
		t.Fatal("listing failed")
	}
	parts := l.unowned
	got := map[int32]unownedPart{}
	for _, p := range parts {
		got[p.partition] = p
	}
	if _, mine := got[0]; mine || len(got) != 2 {
		t.Fatalf("listed %+v, want partitions 1 and 2 only", parts)
	}
	if got[1].lag != 3 || got[2].lag != 4 {
		t.Errorf("lags %d and %d, want 3 and 4", got[1].lag, got[2].lag)
	}
	if got[1].committed != "1 a" || got[2].committed != "" {
		t.Errorf("commits %q and %q, want \"1 a\" and none", got[1].committed, got[2].committed)
	}
	stallClient{s}.OnClientClosed(cl)
	if s.list(ctx, nil).unownedKnown {
		t.Error("listing known after the Consumer's client closed")
	}
}

// lagGroup produces records over the first partitions of topic "t" of c,
// round robin, commits committed for group "g", and returns a member of g
// that s observes, closed when the test ends. The commit comes before the
// group has a member: once one has joined, the broker refuses a commit from
// outside the group (UNKNOWN_MEMBER_ID; 1 of 9 runs beside two CPU hogs). A
// client without a group is shown to s first: it is not the Consumer's.
// The member is built with opts too.
func lagGroup(ctx context.Context, t *testing.T, c *kfake.Cluster, s *stallWatch, partitions int32, records int, committed kadm.Offsets, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for i := range records {
		if err := admin.ProduceSync(ctx, &kgo.Record{Topic: "t", Partition: int32(i) % partitions, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	stallClient{s}.OnNewClient(admin)
	resp, err := kadm.NewClient(admin).CommitOffsets(ctx, "g", committed)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"),
		kgo.WithHooks(stallClient{s})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
