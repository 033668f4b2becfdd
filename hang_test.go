package kpar

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
// hang it, but the records tried after them hang too, which is an outage.
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
