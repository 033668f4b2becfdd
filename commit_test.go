package kpar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/kpar/kpar/internal/offsetmeta"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// commitSignal returns a hook that signals after every commit, and the
// channel it signals on.
func commitSignal() (Hook, <-chan struct{}) {
	ch := make(chan struct{}, 1)
	return commitHook(func(map[string]map[int32]int64, error) {
		select {
		case ch <- struct{}{}:
		default:
		}
	}), ch
}

// waitPartition waits, commit by commit, until the first partition's
// stats satisfy ok.
func waitPartition(t *testing.T, c *Consumer, commits <-chan struct{}, what string, ok func(PartitionStats) bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case <-commits:
			if st := c.Partitions(); len(st) > 0 && ok(st[0]) {
				return
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %s; partitions: %+v", what, c.Partitions())
		}
	}
}

// TestCommitMetadataFallsBackWhenTooLarge runs against a broker whose
// offset.metadata.max.bytes is 20: kpar must keep committing, with less
// metadata, instead of failing every commit.
func TestCommitMetadataFallsBackWhenTooLarge(t *testing.T) {
	c := newFakeCluster(t, "answers OffsetCommit with a kfake control", "meta", 1)
	produce(t, c, "meta", 200, 200)
	var refused int
	var mu sync.Mutex
	c.ControlKey(kmsg.OffsetCommit.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.OffsetCommitRequest)
		tooLarge := false
		for _, t := range req.Topics {
			for _, p := range t.Partitions {
				if p.Metadata != nil && len(*p.Metadata) > 20 {
					tooLarge = true
				}
			}
		}
		if !tooLarge {
			return nil, nil, false
		}
		mu.Lock()
		refused++
		mu.Unlock()
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, t := range req.Topics {
			rt := kmsg.NewOffsetCommitResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetCommitResponseTopicPartition()
				rp.Partition = p.Partition
				rp.ErrorCode = kerr.OffsetMetadataTooLarge.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})

	// Even offsets below 100 wait for release, so the finished set
	// alternates: too large for 20 bytes in either encoding.
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if r.Offset < 100 && r.Offset%2 == 0 {
			<-release
		}
		return nil
	})
	hook, commits := commitSignal()
	cons, err := New(h, append(testOpts(c, "meta", "meta"), Ordering(Unordered), WithHooks(hook))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitPartition(t, cons, commits, "a commit of offset 0 with a cut finished set", func(s PartitionStats) bool {
		return s.Committed == 0 && s.Finished == 150 && s.CommittedFinished > 0 && s.MetadataCut
	})
	close(release)
	waitPartition(t, cons, commits, "the commit of offset 200", func(s PartitionStats) bool { return s.Committed == 200 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if refused == 0 {
		t.Fatal("the broker never refused metadata: the test did not test the fallback")
	}
}

// TestForeignCommitMetadataRedelivers starts a group whose committed
// offsets carry metadata kpar did not write (a kgo member ID, damaged kpar
// metadata): nothing is skipped, every record from the committed offset on
// is handled.
func TestForeignCommitMetadataRedelivers(t *testing.T) {
	c := newFakeCluster(t, notPorted, "foreign", 2)
	l := invariant.New(invariant.ByKey, 0)
	produce(t, c, "foreign", 200, 200, l.Produced)
	adm := adminClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, "foreign")
	if err != nil {
		t.Fatal(err)
	}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: "foreign", Partition: 0, At: 5, LeaderEpoch: -1, Metadata: "kgo-member-1234"})
	os.Add(kadm.Offset{Topic: "foreign", Partition: 1, At: 7, LeaderEpoch: -1, Metadata: "kpar1:BwFyAQAB"}) // offset 7, runs, count 1, then cut short
	if resp, err := adm.CommitOffsets(ctx, "foreign", os); err != nil || resp.Error() != nil {
		t.Fatalf("pre-commit: %v %v", err, resp.Error())
	}

	want := int(end[0]-5) + int(end[1]-7)
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error { l.Handled(r); return nil })
	cons, err := New(h, testOpts(c, "foreign", "foreign")...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, l.Reached(int64(want)), 20*time.Second, "every record from the committed offsets")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Nothing skipped, and nothing below the committed offsets handled.
	if rep := l.Report(); rep.Handled != int64(want) || rep.Duplicates != 0 || rep.OrderViolations != 0 {
		t.Fatalf("%+v, want %d handled once each, in key order", rep, want)
	}
}

// TestBlockedAfterCheapRecordsHoldBackNoOthers: after thousands of cheap
// records, the workers' estimates say records are fast; when records then
// block, in a row or one after another between cheap ones, the ready
// records must still reach idle workers. (A scheduler that saved wake-ups
// while records were cheap, tried and dropped, stalled here.)
func TestBlockedAfterCheapRecordsHoldBackNoOthers(t *testing.T) {
	for _, o := range []Order{ByKey, Unordered} {
		for _, spread := range []int64{1, 50} {
			t.Run(fmt.Sprintf("%s/every%d", o, spread), func(t *testing.T) {
				c := newFakeCluster(t, notPorted, "cheap", 1)
				// Thousands of cheap records, then, once every worker is
				// idle, a second batch with more blocked records than could
				// be running, every spread-th from its start. The first
				// blocked one holds the window start; the batch fits in
				// WindowRecords.
				const warm, n, blocked = 3000, 3900, 8
				l := invariant.New(invariant.ByKey, n-blocked)
				produce(t, c, "cheap", warm, warm, l.Produced) // every record its own key
				release := make(chan struct{})
				h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
					if i := r.Offset - warm; i >= 0 && i%spread == 0 && i/spread < blocked {
						<-release
						return nil
					}
					l.Handled(r)
					return nil
				})
				cons, err := New(h, append(testOpts(c, "cheap", "cheap"), Ordering(o), Concurrency(2*blocked))...)
				if err != nil {
					t.Fatal(err)
				}
				stop := runConsumer(t, cons)
				waitFor(t, l.Reached(warm), 20*time.Second, "the cheap records")
				produceRange(t, c, nameIn(c, "cheap"), warm, n, n, l.Produced)
				waitFor(t, l.AllHandled(), 20*time.Second, "every record but the blocked ones")
				close(release)
				if err := stop(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestSlowRecordDoesNotHoldBackOthers blocks one record's handler while
// fast handlers run: the worker that runs it holds no other record, so
// while it blocks every other record is finished and committed.
func TestSlowRecordDoesNotHoldBackOthers(t *testing.T) {
	for _, o := range []Order{ByKey, Unordered} {
		t.Run(o.String(), func(t *testing.T) {
			c := newFakeCluster(t, notPorted, "slow", 1)
			const n = 900 // below WindowRecords: the blocked record holds the window start
			l := invariant.New(invariant.ByKey, n-1)
			produce(t, c, "slow", n, n, l.Produced) // every record its own key
			release := make(chan struct{})
			h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
				if r.Offset == 500 {
					<-release
					return nil
				}
				l.Handled(r)
				return nil
			})
			hook, commits := commitSignal()
			cons, err := New(h, append(testOpts(c, "slow", "slow"), Ordering(o), Concurrency(8), WithHooks(hook))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			waitFor(t, l.AllHandled(), 20*time.Second, "every record but the blocked one")
			waitPartition(t, cons, commits, "every record but the blocked one finished and committed", func(s PartitionStats) bool {
				return s.InFlight == 1 && s.Committed == 500 && s.CommittedFinished == n-501
			})
			close(release)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// commitRequests counts what HookCommitRequest reports.
type commitRequests struct {
	mu                      sync.Mutex
	requests, parts, nbytes int
}

func (c *commitRequests) OnCommitRequest(partitions, bytes int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.requests++
		c.parts += partitions
		c.nbytes += bytes
	}
}

// TestCommitRequestHookMeasuresCommits: every OffsetCommit a member sends
// is reported with its partitions and its encoded size, the finished-set
// metadata included.
func TestCommitRequestHookMeasuresCommits(t *testing.T) {
	c := newCluster(t, "creq", 4)
	l := invariant.New(invariant.ByKey, 400)
	produce(t, c, "creq", 400, 40, l.Produced)
	reqs := &commitRequests{}
	cons, err := New(HandlerFunc(func(_ context.Context, r *kgo.Record) error { l.Handled(r); return nil }),
		append(testOpts(c, "g", "creq"), WithHooks(reqs))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, l.AllHandled(), 30*time.Second, "every record")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	reqs.mu.Lock()
	defer reqs.mu.Unlock()
	if reqs.requests == 0 || reqs.parts < reqs.requests || reqs.nbytes < reqs.parts*len(offsetmeta.Prefix) {
		t.Fatalf("%d commit requests, %d partitions, %d bytes: want requests, each with a partition and its metadata", reqs.requests, reqs.parts, reqs.nbytes)
	}
}

// TestFailedFinalCommitIsReported: when the commit at shutdown fails, Run
// returns ErrFinalCommit wrapping the failure. Nothing is lost: the
// committed offset stays where the last commit that landed put it.
func TestFailedFinalCommitIsReported(t *testing.T) {
	const n = 100
	c := newFakeCluster(t, "injects broker faults", "final", 1)
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if r.Offset == n-1 {
			<-release // finishes once commits fail
		}
		return nil
	})
	hook, commits := commitSignal()
	cons, err := New(h, append(testOpts(c, "g", "final"), WithHooks(hook))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	produce(t, c, "final", n, 1)
	waitPartition(t, cons, commits, "every record but the last committed", func(s PartitionStats) bool {
		return s.Committed == n-1 && s.InFlight == 1
	})
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: "g", Err: kerr.UnknownServerError, Count: -1})
	close(release)
	if err := stop(); !errors.Is(err, ErrFinalCommit) || !errors.Is(err, kerr.UnknownServerError) {
		t.Fatalf("Run = %v, want ErrFinalCommit wrapping UNKNOWN_SERVER_ERROR", err)
	}
	if committed, _ := offsets(t, c, "g", "final"); committed[0] != n-1 {
		t.Fatalf("committed %v, want partition 0 at %d: the last commit that landed", committed, n-1)
	}
}
