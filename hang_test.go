package kpar

import (
	"context"
	"fmt"
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

// hangUntilCancelled is what kpar forward does with a request the endpoint
// never answers, while it answers no other: it waits for the attempt's
// deadline and reports an overload.
func hangUntilCancelled(ctx context.Context) error {
	<-ctx.Done()
	return Overloaded(ctx.Err())
}

// testHungRecord: a record whose every attempt hangs the downstream, which
// answers every other record, is dead-lettered once HangLimit passed, with
// a message saying it hung the downstream, though each of its timeouts is
// an overload that burns no attempt (issue 35: 38 of 2,000 such records
// were held for ever once the rest was done, and the commit with them).
// Every other record is handled.
func testHungRecord(t *testing.T, src flowSource) {
	const n = 200
	hangs := func(i int) bool { return i%50 == 7 }
	cl := newCell(t, src, n, func(i int) int { return i % 20 })
	l := cl.produced(invariant.Unordered)
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if hangs(recordIndex(r)) {
			return hangUntilCancelled(ctx)
		}
		l.Handled(r)
		return nil
	})
	sink := &memSink{}
	if !cl.mustRun(h, AttemptTimeout(100*time.Millisecond), HangLimit(time.Second), DeadLetters(sink)) {
		return
	}
	dead := lettersByIndex(sink)
	for i := range n {
		switch ls := dead[i]; {
		case !hangs(i) && len(ls) > 0:
			t.Errorf("%s dead-lettered, though it never hung: %s", cl.describe(i), ls[0].Message)
		case hangs(i) && len(ls) != 1:
			t.Errorf("%s hangs every attempt: %d dead letters, want 1: %s", cl.describe(i), len(ls), cl.unfinished())
		case hangs(i) && (ls[0].Class != deadletter.ClassTimeout || !strings.Contains(ls[0].Message, "hung the downstream")):
			t.Errorf("%s dead-lettered as %s %q, want class timeout and a message saying it hung the downstream", cl.describe(i), ls[0].Class, ls[0].Message)
		}
	}
	if rep := l.Report(); rep.Handled != n-4 {
		t.Errorf("%d of %d records handled: %s", rep.Handled, n-4, cl.unfinished())
	}
}

// testHangingOutage: a downstream that stops answering anything for three
// times HangLimit, after it answered the first records, dead-letters
// nothing: the records in flight when it stopped look like records that
// hang it, but the records tried after them hang too, or (in partition
// order, in a share group, where they are all that can run) three or more
// of them hang at once with nothing answered since, which is an outage.
// Every record is handled once it answers again.
func testHangingOutage(t *testing.T, src flowSource) {
	const n, before, limit = 200, 40, time.Second
	cl := newCell(t, src, n, func(i int) int { return i % 40 })
	l := cl.produced(invariant.Unordered)
	var (
		handled atomic.Int64
		mu      sync.Mutex
		began   time.Time // the outage's start; zero before
	)
	down := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if began.IsZero() && handled.Load() >= before {
			began = time.Now()
		}
		return !began.IsZero() && time.Since(began) < 3*limit
	}
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if down() {
			return hangUntilCancelled(ctx)
		}
		handled.Add(1)
		l.Handled(r)
		return nil
	})
	sink := &memSink{}
	if !cl.mustRun(h, AttemptTimeout(100*time.Millisecond), HangLimit(limit), DeadLetters(sink), Concurrency(8)) {
		return
	}
	if dead := lettersByIndex(sink); len(dead) > 0 {
		i := firstKeys(dead, 1)[0]
		t.Errorf("%d records dead-lettered for an outage in which every request hung, first %s: %s", len(dead), cl.describe(i), dead[i][0].Message)
	}
	if rep := l.Report(); rep.Handled != n {
		t.Errorf("%d of %d records handled: %s", rep.Handled, n, cl.unfinished())
	}
}

// The hang policy in virtual time (testing/synctest): a partition-ordered
// consumer of a virtual cluster, AttemptTimeout 100ms, HangLimit 1s. In a
// bubble every record dispatched at one instant starts at the same time,
// so a success counts as "answered while a record hung" only when its
// attempt began at a later instant.

// hangPartitions produces perPartition[p] records to partition p of
// topic, valued "p/i".
func hangPartitions(t *testing.T, c *kfake.Cluster, dial kgo.Opt, topic string, perPartition ...int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), dial, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var rs []*kgo.Record
	for p, n := range perPartition {
		for i := range n {
			rs = append(rs, &kgo.Record{Partition: int32(p), Value: fmt.Appendf(nil, "%d/%d", p, i)})
		}
	}
	if err := cl.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// runHanging consumes topic in partition order with h until every one of
// n records was handled (h reports it through handled) or dead-lettered,
// within a virtual minute, and returns the dead letters by record value.
func runHanging(t *testing.T, c *kfake.Cluster, dial kgo.Opt, topic string, n int, handled *atomic.Int64, h HandlerFunc) map[string]deadletter.Letter {
	t.Helper()
	sink := &memSink{}
	_, stop := runVirtual(t, c, dial, topic, h, Ordering(ByPartition), AttemptTimeout(100*time.Millisecond), HangLimit(time.Second), DeadLetters(sink))
	letters := func() map[string]deadletter.Letter {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		out := map[string]deadletter.Letter{}
		for _, l := range sink.letters {
			out[string(l.Record.Value)] = l
		}
		return out
	}
	for start := time.Now(); int(handled.Load())+len(letters()) < n; {
		if time.Since(start) > time.Minute {
			t.Fatalf("%d of %d records handled and %d dead-lettered after a minute", handled.Load(), n, len(letters()))
		}
		time.Sleep(10 * time.Millisecond) // virtual
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return letters()
}

// wantHung checks that letters are exactly the records of values, each
// dead-lettered as having hung the downstream.
func wantHung(t *testing.T, letters map[string]deadletter.Letter, values ...string) {
	t.Helper()
	for _, v := range values {
		l, ok := letters[v]
		switch {
		case !ok:
			t.Errorf("record %s hangs every attempt and was not dead-lettered", v)
		case l.Class != deadletter.ClassTimeout || !strings.Contains(l.Message, "hung the downstream"):
			t.Errorf("record %s dead-lettered as %s %q, want class timeout and a message saying it hung the downstream", v, l.Class, l.Message)
		}
		delete(letters, v)
	}
	for v, l := range letters {
		t.Errorf("record %s dead-lettered, though it never hung: %s", v, l.Message)
	}
}

// TestHangPolicyHoldsAnOutageThatMeetsOnlyThePartitionsHeads: in
// partition order, a downstream that stops answering anything for five
// times HangLimit meets the four partitions' heads, all that can run,
// which start hanging 30ms apart after the last answer: weak suspects
// (answered before their hangs began, never during), and four of them at
// once, which is an outage. Nothing is dead-lettered, neither during the
// outage nor at its end, when the first head answered finds the others
// in attempts begun during the outage (their streaks started again while
// it lasted), and every record is handled once it is over.
func TestHangPolicyHoldsAnOutageThatMeetsOnlyThePartitionsHeads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const topic, n, head = "outage", 20, 2
		c, dial := virtualCluster(t, topic, 4)
		hangPartitions(t, c, dial, topic, 5, 5, 5, 5)
		var handled atomic.Int64
		t0 := time.Now()
		letters := runHanging(t, c, dial, topic, n, &handled, func(ctx context.Context, r *kgo.Record) error {
			switch {
			case r.Offset == head-1:
				time.Sleep(time.Duration(r.Partition) * 30 * time.Millisecond) // virtual: the heads' phases
			case r.Offset >= head && time.Since(t0) < 5*time.Second:
				return hangUntilCancelled(ctx)
			}
			handled.Add(1)
			return nil
		})
		wantHung(t, letters)
		if handled.Load() != n {
			t.Errorf("%d of %d records handled", handled.Load(), n)
		}
	})
}

// TestHangPolicyDeadLettersTwoRecordsThatHangTogether: the last record of
// each of two partitions hangs every attempt, and both start at the
// instant the last other record was answered: two weak suspects at once,
// with nothing else to run. Two is not an outage (records that hang come
// due together when their predecessors were dead-lettered together), so
// both are dead-lettered after HangLimit.
func TestHangPolicyDeadLettersTwoRecordsThatHangTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const topic = "pair"
		c, dial := virtualCluster(t, topic, 2)
		hangPartitions(t, c, dial, topic, 3, 3)
		var handled atomic.Int64
		letters := runHanging(t, c, dial, topic, 6, &handled, func(ctx context.Context, r *kgo.Record) error {
			if r.Offset == 2 {
				return hangUntilCancelled(ctx)
			}
			handled.Add(1)
			return nil
		})
		wantHung(t, letters, "0/2", "1/2")
	})
}

// TestHangPolicyDeadLettersRecordsThatHangWhileOthersAreAnswered: three
// partitions' heads hang every attempt while the fourth partition's
// records, 30ms each, are answered one after another: records sent after
// the heads' hangs began are answered, so the suspicion is strong, and
// three of them hanging at once is no outage. They are dead-lettered
// after HangLimit, and the records behind them handled.
func TestHangPolicyDeadLettersRecordsThatHangWhileOthersAreAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const topic = "strong"
		c, dial := virtualCluster(t, topic, 4)
		hangPartitions(t, c, dial, topic, 2, 2, 2, 20)
		var handled atomic.Int64
		letters := runHanging(t, c, dial, topic, 26, &handled, func(ctx context.Context, r *kgo.Record) error {
			switch {
			case r.Partition < 3 && r.Offset == 0:
				return hangUntilCancelled(ctx)
			case r.Partition == 3:
				time.Sleep(30 * time.Millisecond) // virtual
			}
			handled.Add(1)
			return nil
		})
		wantHung(t, letters, "0/0", "1/0", "2/0")
	})
}
