package kpar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
	invariant "github.com/kpar/kpar/internal/ledger"
)

// newShareCluster starts kfake with topic and share-group locks of lock
// (swept every lock/10), and the given broker configs on top.
func newShareCluster(t testing.TB, topic string, partitions int32, lock time.Duration, configs map[string]string) *kfake.Cluster {
	t.Helper()
	bc := map[string]string{
		"group.share.record.lock.duration.ms": fmt.Sprint(lock.Milliseconds()),
		"share.record.lock.sweep.interval.ms": fmt.Sprint(max(lock.Milliseconds()/10, 5)),
	}
	for k, v := range configs {
		bc[k] = v
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topic),
		kfake.AllowAutoTopicCreation(),
		kfake.BrokerConfigs(bc),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// shareOpts are testOpts with a share group instead of a consumer group.
func shareOpts(c *kfake.Cluster, group, topic string) []ConsumerOpt {
	opts := testOpts(c, "", topic)
	return append(opts, ShareGroup(group), ClientOptions(kgo.FetchMaxWait(50*time.Millisecond)))
}

// runShare runs a member of share group sg on topic with h and opts (on
// top of shareOpts) until the test ends or stop is called.
func runShare(t *testing.T, c *kfake.Cluster, topic string, h Handler, opts ...ConsumerOpt) (cons *Consumer, stop func() error) {
	t.Helper()
	cons, err := New(h, append(shareOpts(c, "sg", topic), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cons, runConsumer(t, cons)
}

// shareStats waits for c's share stats to satisfy ok, failing after d.
func awaitShareStats(t *testing.T, c *Consumer, d time.Duration, what string, ok func(ShareStats) bool) ShareStats {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, _ := c.ShareStats()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; share stats %+v", d, what, st)
		}
		time.Sleep(5 * time.Millisecond) // polling a snapshot, not waiting for time to pass
	}
}

// rawShareRecords polls a plain franz-go share consumer of group until fn
// returns false or 10s passed, acknowledging each record with fn's status.
func rawShareRecords(t *testing.T, c *kfake.Cluster, group, topic string, fn func(*kgo.Record) (kgo.AckStatus, bool)) {
	t.Helper()
	c.SetGroupConfigs(group, map[string]string{"share.auto.offset.reset": "earliest"})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ShareGroup(group), kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for more := true; more; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("raw share consumer: %v", ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !more {
				r.Ack(kgo.AckRelease)
				return
			}
			var st kgo.AckStatus
			st, more = fn(r)
			if !more {
				// Fetch nothing more: the client would acquire a
				// released record again, burning a delivery.
				cl.PauseFetchTopics(topic)
			}
			r.Ack(st)
		})
	}
	if err := cl.FlushAcks(ctx); err != nil {
		t.Fatal(err)
	}
	cl.LeaveGroupContext(ctx)
}

func TestShareOptionsRejectWhatShareGroupsCannotKeep(t *testing.T) {
	h := HandlerFunc(func(context.Context, *kgo.Record) error { return nil })
	base := []ConsumerOpt{Brokers("127.0.0.1:1"), Topics("t"), ShareGroup("s")}
	for _, tc := range []struct {
		name string
		opt  ConsumerOpt
		want string
	}{
		{"partition order", Ordering(ByPartition), "use ByKey"},
		{"both groups", Group("g"), "both Group and ShareGroup"},
		{"retry topics", RetryTopics(time.Second), "RetryTopics is not supported with ShareGroup"},
		{"instance id", InstanceID("i"), "no static membership"},
		{"commit metadata", CommitMetadataBytes(100), "CommitMetadataBytes is not supported with ShareGroup"},
		{"revoke timeout", RevokeTimeout(time.Second), "RevokeTimeout is not supported with ShareGroup"},
		{"commit budget", CommitBudget(100), "CommitBudget is not supported with ShareGroup"},
		{"commit interval", CommitInterval(time.Second), "CommitInterval is not supported with ShareGroup"},
		{"client share group", ClientOptions(kgo.ShareGroup("x")), "use kpar.ShareGroup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(h, append(base, tc.opt)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := New(h, append(base, Ordering(Unordered), AdaptiveConcurrency(), RateLimit(10, 1), WindowRecords(10))...); err != nil {
		t.Fatalf("Unordered share consumer with the pipeline's flow rules: %v", err)
	}
}

// TestShareTwoMembersShareOnePartition: two members of one share group on a
// topic with a single partition both handle records, and every record is
// handled.
func TestShareTwoMembersShareOnePartition(t *testing.T) {
	const topic, n = "share-two", 400
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	l := invariant.New(invariant.Unordered, n)
	produce(t, c, topic, n, 50, l.Produced)

	var got [2]atomic.Int64
	bothGot := make(chan struct{})
	var once sync.Once
	handler := func(i int) Handler {
		return HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
			got[i].Add(1)
			if got[0].Load() > 0 && got[1].Load() > 0 {
				once.Do(func() { close(bothGot) })
			}
			// The first member holds its first records until the other
			// has some: one member alone could drain the partition.
			if i == 0 {
				select {
				case <-bothGot:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			l.Handled(r)
			return nil
		})
	}
	for i := range 2 {
		runShare(t, c, topic, handler(i), Concurrency(4))
	}
	waitFor(t, bothGot, 20*time.Second, "both members to receive records")
	waitFor(t, l.AllHandled(), 30*time.Second, "every record handled")
	if got[0].Load() == 0 || got[1].Load() == 0 {
		t.Fatalf("records per member %d and %d: want both above 0", got[0].Load(), got[1].Load())
	}
	t.Logf("member 0 handled %d, member 1 %d", got[0].Load(), got[1].Load())
}

// TestShareRetriesLocallyThenAccepts: a failing record is retried with
// kpar's backoff while this member holds it, then accepted; the broker
// never redelivers it.
func TestShareRetriesLocallyThenAccepts(t *testing.T) {
	const topic, n = "share-retry", 20
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	l := invariant.New(invariant.Unordered, n)
	produce(t, c, topic, n, 5, l.Produced)

	var mu sync.Mutex
	attempts := map[int64]int{}
	cons, stop := runShare(t, c, topic, HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		mu.Lock()
		attempts[r.Offset]++
		a := attempts[r.Offset]
		mu.Unlock()
		if r.DeliveryCount() != 1 {
			return Permanent(fmt.Errorf("offset %d delivered %d times", r.Offset, r.DeliveryCount()))
		}
		if r.Offset%4 == 0 && a < 3 {
			return errors.New("flaky")
		}
		l.Handled(r)
		return nil
	}), MaxAttempts(3))
	waitFor(t, l.AllHandled(), 20*time.Second, "every record handled")
	st := awaitShareStats(t, cons, 10*time.Second, "all accepted", func(s ShareStats) bool { return s.Accepted == n })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st.Released != 0 || st.Redelivered != 0 || st.DeadLettered != 0 || st.MaxDeliveryCount != 1 {
		t.Fatalf("stats %+v: want no release, redelivery or dead letter, delivery count 1", st)
	}
	for off, a := range attempts {
		if want := map[bool]int{true: 3, false: 1}[off%4 == 0]; a != want {
			t.Errorf("offset %d: %d attempts, want %d", off, a, want)
		}
	}
}

// TestSharePermanentGoesToTheSinkBeforeItIsAccepted: the sink sees the
// record while the member still holds it; afterwards the group does not
// deliver it again.
func TestSharePermanentGoesToTheSinkBeforeItIsAccepted(t *testing.T) {
	const topic = "share-dlq"
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	produce(t, c, topic, 1, 1)

	var cons *Consumer
	var heldWhileWritten atomic.Bool
	written := make(chan struct{})
	sink := sinkFunc(func(_ context.Context, ls []deadletter.Letter) error {
		st, _ := cons.ShareStats()
		heldWhileWritten.Store(st.Acquired == 1 && st.Accepted == 0)
		if len(ls) != 1 || ls[0].Group != "sg" || ls[0].Class != deadletter.ClassPermanent {
			t.Errorf("letters %+v: want one permanent letter of group sg", ls)
		}
		close(written)
		return nil
	})
	cons, err := New(HandlerFunc(func(context.Context, *kgo.Record) error {
		return Permanent(errors.New("bad schema"))
	}), append(shareOpts(c, "sg", topic), DeadLetters(sink))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, written, 20*time.Second, "the dead letter")
	st := awaitShareStats(t, cons, 10*time.Second, "the dead letter accepted", func(s ShareStats) bool { return s.DeadLettered == 1 && s.Acquired == 0 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !heldWhileWritten.Load() {
		t.Fatal("the record was acknowledged before the sink acknowledged it")
	}
	if st.Accepted != 1 || st.Released != 0 {
		t.Fatalf("stats %+v: want 1 accepted, 0 released", st)
	}
	// A sentinel produced now is the next record the group delivers: the
	// dead-lettered one is gone.
	produce(t, c, topic, 1, 1)
	rawShareRecords(t, c, "sg", topic, func(r *kgo.Record) (kgo.AckStatus, bool) {
		if r.Offset != 1 {
			t.Errorf("the group delivered offset %d (delivery %d) again", r.Offset, r.DeliveryCount())
		}
		return kgo.AckAccept, r.Offset != 1
	})
}

type sinkFunc func(context.Context, []deadletter.Letter) error

func (f sinkFunc) Write(ctx context.Context, ls []deadletter.Letter) error { return f(ctx, ls) }

type deadFailedHook struct{ n atomic.Int64 }

func (h *deadFailedHook) OnDeadLetterFailed(int, error) { h.n.Add(1) }

// TestShareSinkFailureDoesNotAccept: while the sink fails the record stays
// held and unacknowledged; at shutdown it is released, and the group
// delivers it again.
func TestShareSinkFailureDoesNotAccept(t *testing.T) {
	const topic = "share-sink-down"
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	produce(t, c, topic, 1, 1)

	hook := new(deadFailedHook)
	sink := sinkFunc(func(context.Context, []deadletter.Letter) error { return errors.New("sink down") })
	cons, stop := runShare(t, c, topic, HandlerFunc(func(context.Context, *kgo.Record) error {
		return Permanent(errors.New("bad schema"))
	}), DeadLetters(sink), WithHooks(hook), ShutdownTimeout(500*time.Millisecond))
	awaitShareStats(t, cons, 20*time.Second, "a failed sink write", func(ShareStats) bool { return hook.n.Load() >= 2 })
	st, _ := cons.ShareStats()
	if st.Accepted != 0 || st.Acquired != 1 {
		t.Fatalf("stats %+v while the sink fails: want 0 accepted, 1 acquired", st)
	}
	if err := stop(); !errors.Is(err, ErrShutdownTimeout) {
		t.Fatalf("Run: %v, want ErrShutdownTimeout (the record could not be finished)", err)
	}
	st, _ = cons.ShareStats()
	if st.Accepted != 0 || st.Released != 1 {
		t.Fatalf("stats %+v after shutdown: want 0 accepted, 1 released", st)
	}
	rawShareRecords(t, c, "sg", topic, func(r *kgo.Record) (kgo.AckStatus, bool) {
		if r.Offset != 0 || r.DeliveryCount() != 2 {
			t.Errorf("got offset %d delivery %d, want offset 0 delivered a second time", r.Offset, r.DeliveryCount())
		}
		return kgo.AckAccept, false
	})
}

// TestShareShutdownReleasesWhatDidNotStart: at shutdown the running record
// finishes and is accepted, the records queued behind it are released, and
// the next member gets them.
func TestShareShutdownReleasesWhatDidNotStart(t *testing.T) {
	const topic, n = "share-stop", 10
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	produce(t, c, topic, n, 1) // one key: one record runs at a time

	cons, h, cancel, done := runHoldingFirst(t, c, topic, Concurrency(1))
	held, _ := cons.ShareStats()
	cancel()
	awaitShareStats(t, cons, 10*time.Second, "the queued records released", func(s ShareStats) bool { return s.Released == int64(held.Acquired-1) })
	close(h.proceed)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	st, _ := cons.ShareStats()
	if h.handled.Load() != 1 || st.Accepted != 1 {
		t.Fatalf("handled %d, stats %+v: want the running record finished and accepted, nothing else started", h.handled.Load(), st)
	}
	seen := map[int64]bool{}
	rawShareRecords(t, c, "sg", topic, func(r *kgo.Record) (kgo.AckStatus, bool) {
		if r.Offset == 0 {
			t.Errorf("offset 0 was accepted yet delivered again")
		}
		if want := int32(1); r.Offset < int64(held.Acquired) {
			want = 2
			if r.DeliveryCount() != want {
				t.Errorf("released offset %d: delivery %d, want %d", r.Offset, r.DeliveryCount(), want)
			}
		}
		seen[r.Offset] = true
		return kgo.AckAccept, len(seen) < n-1
	})
}

// TestShareRenewsTheLockOfALongHandler: a handler running for several lock
// durations keeps its record: the broker does not hand it to another
// member.
func TestShareRenewsTheLockOfALongHandler(t *testing.T) {
	const topic = "share-renew"
	lock := time.Second // the shortest lock franz-go (and Kafka) accept
	c := newShareCluster(t, topic, 1, lock, nil)
	produce(t, c, topic, 1, 1)

	started := make(chan struct{})
	release := make(chan struct{})
	cons, stop := runShare(t, c, topic, HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		close(started)
		<-release
		return nil
	}))
	waitFor(t, started, 20*time.Second, "the record to start")
	// Another member polls for two and a half lock durations: it must
	// get nothing.
	other, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ShareGroup("sg"), kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(context.Background(), 5*lock/2)
	fs := other.PollFetches(pctx)
	cancel()
	if n := fs.NumRecords(); n > 0 {
		t.Errorf("another member got %d records while the handler ran: the lock was not renewed", n)
	}
	other.Close()
	close(release)
	st := awaitShareStats(t, cons, 10*time.Second, "the record accepted", func(s ShareStats) bool { return s.Accepted == 1 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st.Renewed == 0 {
		t.Fatalf("stats %+v: want renewals", st)
	}
}

// TestShareLastDeliveryStillReachesTheSink: a record on the broker's last
// delivery that keeps failing is dead-lettered before it is accepted (a
// release would make the broker archive it unseen).
func TestShareLastDeliveryStillReachesTheSink(t *testing.T) {
	const topic = "share-last"
	c := newShareCluster(t, topic, 1, 30*time.Second, map[string]string{"group.share.delivery.count.limit": "2"})
	produce(t, c, topic, 1, 1)
	// First delivery: a plain consumer releases it.
	rawShareRecords(t, c, "sg", topic, func(*kgo.Record) (kgo.AckStatus, bool) { return kgo.AckRelease, false })

	sink := new(memSink)
	cons, stop := runShare(t, c, topic, HandlerFunc(func(context.Context, *kgo.Record) error {
		return errors.New("still failing")
	}), DeadLetters(sink), MaxAttempts(3))
	st := awaitShareStats(t, cons, 20*time.Second, "the dead letter", func(s ShareStats) bool { return s.DeadLettered == 1 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st.MaxDeliveryCount != 2 || st.DeliveryLimit != 2 || st.Released != 0 {
		t.Fatalf("stats %+v: want delivery 2 of limit 2, nothing released", st)
	}
	wantOneLetter(t, sink, deadletter.ClassExhausted, 3)
}

// wantOneLetter fails the test unless sink holds one letter, of class
// after attempts attempts.
func wantOneLetter(t *testing.T, sink *memSink, class deadletter.Class, attempts int) {
	t.Helper()
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.letters) != 1 || sink.letters[0].Class != class || sink.letters[0].Attempts != attempts {
		t.Fatalf("letters %+v: want one %s letter after %d attempts", sink.letters, class, attempts)
	}
}

// TestShareAttemptTimeoutCancelsTheHandler: AttemptTimeout cancels a
// handler's context in share mode too, and the record is dead-lettered as
// a timeout.
func TestShareAttemptTimeoutCancelsTheHandler(t *testing.T) {
	const topic = "share-timeout"
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	produce(t, c, topic, 1, 1)

	sink := new(memSink)
	cons, stop := runShare(t, c, topic, HandlerFunc(func(ctx context.Context, _ *kgo.Record) error {
		<-ctx.Done()
		return ctx.Err()
	}), DeadLetters(sink), MaxAttempts(2), AttemptTimeout(50*time.Millisecond))
	awaitShareStats(t, cons, 20*time.Second, "the dead letter", func(s ShareStats) bool { return s.DeadLettered == 1 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantOneLetter(t, sink, deadletter.ClassTimeout, 2)
}

// TestShareByKeyRunsOneRecordPerKeyAtATime: in ByKey mode a member never
// runs two records of one key at once, and a key's records of one poll run
// in offset order.
func TestShareByKeyRunsOneRecordPerKeyAtATime(t *testing.T) {
	const topic, n, keys = "share-keys", 300, 5
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	l := invariant.New(invariant.Unordered, n)
	produce(t, c, topic, n, keys, l.Produced)

	var mu sync.Mutex
	running := map[string]int{}
	last := map[string]int64{}
	_, stop := runShare(t, c, topic, HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		k := string(r.Key)
		mu.Lock()
		running[k]++
		if running[k] > 1 {
			t.Errorf("key %s: %d records at once", k, running[k])
		}
		if off, ok := last[k]; ok && r.Offset < off {
			t.Errorf("key %s: offset %d after %d", k, r.Offset, off)
		}
		last[k] = r.Offset
		mu.Unlock()
		time.Sleep(100 * time.Microsecond) // some overlap between keys
		mu.Lock()
		running[k]--
		mu.Unlock()
		l.Handled(r)
		return nil
	}), Concurrency(16))
	waitFor(t, l.AllHandled(), 20*time.Second, "every record handled")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestShareSlowRecordDoesNotHoldBackOthers blocks one record's handler
// while fast handlers run: the worker that runs it holds no other record,
// so every other record of its poll is handled and acknowledged while it
// blocks (the next poll waits for it: see poll).
func TestShareSlowRecordDoesNotHoldBackOthers(t *testing.T) {
	const topic, n, blocked = "share-slow", 400, 200
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	produce(t, c, topic, n, n) // every record its own key
	release, started := make(chan struct{}), make(chan struct{})
	cons, stop := runShare(t, c, topic, HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if r.Offset != blocked {
			return nil
		}
		close(started)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}), Concurrency(8))
	waitFor(t, started, 20*time.Second, "the blocked record to start")
	awaitShareStats(t, cons, 20*time.Second, "every other record of its poll acknowledged", func(s ShareStats) bool {
		return s.Acquired == 1 && s.InFlight == 1
	})
	close(release)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestShareBatchHandlerGetsOneKeyPerBatch: NewBatch works in share mode; in
// ByKey mode a batch holds records of one key, in offset order.
func TestShareBatchHandlerGetsOneKeyPerBatch(t *testing.T) {
	const topic, n, keys = "share-batch", 200, 4
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	l := invariant.New(invariant.Unordered, n)
	produce(t, c, topic, n, keys, l.Produced)

	var batches, multi atomic.Int64
	cons, err := NewBatch(BatchHandlerFunc(func(_ context.Context, rs []*kgo.Record) error {
		batches.Add(1)
		if len(rs) > 1 {
			multi.Add(1)
		}
		for i, r := range rs {
			if string(r.Key) != string(rs[0].Key) || (i > 0 && r.Offset <= rs[i-1].Offset) {
				t.Errorf("batch %v: records of several keys, or out of order", rs)
			}
			l.Handled(r)
		}
		return nil
	}), append(shareOpts(c, "sg", topic), Concurrency(2), BatchSize(10))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, l.AllHandled(), 20*time.Second, "every record handled")
	st := awaitShareStats(t, cons, 10*time.Second, "all accepted", func(s ShareStats) bool { return s.Accepted == n })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if multi.Load() == 0 {
		t.Errorf("%d batches, none with more than one record", batches.Load())
	}
	t.Logf("%d batches for %d records; stats %+v", batches.Load(), n, st)
}

// TestShareShutdownFinishesRecordsOnTheirLastDelivery: at shutdown records
// on their last delivery are not released (the broker would archive them
// unseen) but run, within ShutdownTimeout.
func TestShareShutdownFinishesRecordsOnTheirLastDelivery(t *testing.T) {
	const topic, n = "share-last-stop", 3
	c := newShareCluster(t, topic, 1, 30*time.Second, map[string]string{"group.share.delivery.count.limit": "2"})
	produce(t, c, topic, n, 1) // one key: one record runs at a time
	released := 0
	rawShareRecords(t, c, "sg", topic, func(*kgo.Record) (kgo.AckStatus, bool) {
		released++
		return kgo.AckRelease, released < n
	})

	cons, h, cancel, done := runHoldingFirst(t, c, topic, Concurrency(2)) // a poll of 4 takes all 3
	cancel()
	close(h.proceed)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	st, _ := cons.ShareStats()
	// The broker may hand fewer than all three to the one poll (the next
	// waits for the held record): what the member received on its last
	// delivery must be finished, not released.
	if st.Received < n {
		t.Logf("the poll brought %d of the %d records", st.Received, n)
	}
	if h.handled.Load() != st.Received || st.Accepted != st.Received || st.Released != 0 || st.MaxDeliveryCount != 2 {
		t.Fatalf("handled %d, stats %+v: want every record received on its last delivery handled and accepted, none released", h.handled.Load(), st)
	}
}

// holdFirst is the handler of the shutdown tests: it holds the first
// record it gets until proceed is closed (started closes as it begins),
// and counts the records handled.
type holdFirst struct {
	started, proceed chan struct{}
	handled          atomic.Int64
}

func (h *holdFirst) Handle(context.Context, *kgo.Record) error {
	if h.handled.Load() == 0 {
		close(h.started)
		<-h.proceed
	}
	h.handled.Add(1)
	return nil
}

// runHoldingFirst runs a member of sg on topic with a holdFirst handler
// and opts, and returns once the first record started: cancel begins the
// shutdown, done receives Run's error.
func runHoldingFirst(t *testing.T, c *kfake.Cluster, topic string, opts ...ConsumerOpt) (cons *Consumer, h *holdFirst, cancel func(), done <-chan error) {
	t.Helper()
	h = &holdFirst{started: make(chan struct{}), proceed: make(chan struct{})}
	cons, err := New(h, append(shareOpts(c, "sg", topic), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- cons.Run(ctx) }()
	waitFor(t, h.started, 20*time.Second, "the first record to start")
	return cons, h, cancel, ran
}

// newBareShare is a share source on a whole pipeline but no share
// consumer: cl, a plain client (made outside any synctest bubble, while
// the pipeline is made inside one, so that its goroutines block durably),
// stands in, on which acknowledgements are no-ops. admit feeds it records
// as a poll would.
func newBareShare(t *testing.T, cl *kgo.Client, h Handler, opts ...ConsumerOpt) *shareSource {
	t.Helper()
	cons, err := New(h, append([]ConsumerOpt{Brokers("127.0.0.1:1"), Topics("t"), ShareGroup("sg"),
		WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	e, err := newEngine(&cons.cfg, cons.handler, cons.batch, &cons.hooks, consumerSource)
	if err != nil {
		t.Fatal(err)
	}
	s := e.src.(*shareSource)
	s.cl = cl
	return s
}

// fetchesOfKey is a poll of records of key at offsets of partition t/0.
func fetchesOfKey(key string, offsets ...int64) kgo.Fetches {
	var recs []*kgo.Record
	for _, o := range offsets {
		recs = append(recs, &kgo.Record{Topic: "t", Key: []byte(key), Offset: o})
	}
	return kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: "t", Partitions: []kgo.FetchPartition{{Partition: 0, Records: recs}}}}}}
}

// startWorkers runs the workers and the settler of s's pipeline until the
// returned function stops them.
func startWorkers(s *shareSource) (stop func()) {
	e := s.e
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range e.cfg.concurrency {
		wg.Go(func() { e.worker(ctx, i) })
	}
	wg.Go(func() { e.settler(ctx) })
	return func() {
		e.mu.Lock()
		e.stop = true
		e.stopGuard()
		e.retries.Forget(nil, stopRetry)
		e.cond.Broadcast()
		e.mu.Unlock()
		cancel()
		wg.Wait()
	}
}

// twoOfAKeyInVirtualTime runs body in a synctest bubble, on a bare
// runner of h with two workers once it took records 0 and 1 of key k and
// every goroutine of the bubble is blocked.
func twoOfAKeyInVirtualTime(t *testing.T, h Handler, body func(t *testing.T, s *shareSource)) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	synctest.Test(t, func(t *testing.T) {
		s := newBareShare(t, cl, h, Concurrency(2))
		stop := startWorkers(s)
		defer stop()
		s.admit(fetchesOfKey("k", 0, 1))
		synctest.Wait()
		body(t, s)
	})
}

// TestShareRetryWaitsItsBackoffWhileHeld, in virtual time: a failed record
// stays held (not released) for its backoff, the next record of its key
// waits behind it, and both are accepted once it succeeds.
func TestShareRetryWaitsItsBackoffWhileHeld(t *testing.T) {
	var mu sync.Mutex
	attempts := map[int64]int{}
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[r.Offset]++
		if r.Offset == 0 && attempts[0] == 1 {
			return RetryAfter(errors.New("busy"), 2*time.Second)
		}
		return nil
	})
	twoOfAKeyInVirtualTime(t, h, func(t *testing.T, s *shareSource) {
		check := func(when string, a0, a1, acquired, retrying int, accepted int64) {
			t.Helper()
			mu.Lock()
			got0, got1 := attempts[0], attempts[1]
			mu.Unlock()
			st := s.snapshot()
			if got0 != a0 || got1 != a1 || st.Acquired != acquired || st.Retrying != retrying || st.Accepted != accepted || st.Released != 0 {
				t.Fatalf("%s: attempts %d, %d; stats %+v; want attempts %d, %d, %d acquired, %d retrying, %d accepted, none released",
					when, got0, got1, st, a0, a1, acquired, retrying, accepted)
			}
		}
		check("after the first attempt", 1, 0, 2, 1, 0)
		time.Sleep(2*time.Second - time.Millisecond)
		synctest.Wait()
		check("just before the backoff ends", 1, 0, 2, 1, 0)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		check("after the backoff", 2, 1, 0, 0, 2)
	})
}

// TestShareShutdownReleasesRetriesAndQueuedRecords, in virtual time: at
// shutdown a record waiting for its retry and the record queued behind it
// are released at once, and nothing runs afterwards.
func TestShareShutdownReleasesRetriesAndQueuedRecords(t *testing.T) {
	var runs atomic.Int64
	h := HandlerFunc(func(context.Context, *kgo.Record) error {
		runs.Add(1)
		return RetryAfter(errors.New("busy"), time.Minute)
	})
	twoOfAKeyInVirtualTime(t, h, func(t *testing.T, s *shareSource) {
		s.e.withdrawAll()
		synctest.Wait()
		st := s.snapshot()
		if st.Released != 2 || st.Acquired != 0 || st.Retrying != 0 {
			t.Fatalf("stats %+v: want both records released, nothing held", st)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if n := runs.Load(); n != 1 {
			t.Fatalf("%d handler runs, want 1: a released record must not run again", n)
		}
	})
}

// TestShareOverdueAndAccessorsBetweenRuns: a share member reports attempts
// that run past AttemptTimeout while ignoring their context (Overdue), as a
// consumer group member does, and after Run returns the accessors report
// no run: no partitions, a concurrency limit of 0, nothing overdue.
func TestShareOverdueAndAccessorsBetweenRuns(t *testing.T) {
	const topic = "share-overdue"
	c := newShareCluster(t, topic, 1, 30*time.Second, nil)
	produce(t, c, topic, 1, 1)
	release := make(chan struct{})
	h := HandlerFunc(func(context.Context, *kgo.Record) error { <-release; return nil }) // ignores its context
	cons, err := New(h, append(shareOpts(c, "sg", topic), AttemptTimeout(50*time.Millisecond), ShutdownTimeout(5*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	deadline := time.Now().Add(10 * time.Second)
	for cons.Overdue() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("Overdue = %d, want 1 for the attempt hanging past AttemptTimeout", cons.Overdue())
		}
		time.Sleep(5 * time.Millisecond) // polling a snapshot, not waiting for time to pass
	}
	if got := cons.ConcurrencyLimit(); got != 64 {
		t.Errorf("ConcurrencyLimit while running = %d, want 64", got)
	}
	close(release)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if p, l, o := cons.Partitions(), cons.ConcurrencyLimit(), cons.Overdue(); p != nil || l != 0 || o != 0 {
		t.Errorf("after Run: Partitions %v, ConcurrencyLimit %d, Overdue %d; want nil, 0, 0", p, l, o)
	}
}
