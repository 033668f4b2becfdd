package kpar

import (
	"context"
	"runtime"
	"testing"
	"time"

	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestCheapHandlerKeepsFewWorkersAwake: with a cheap handler and a backlog
// the cap holds wake-ups back, so far fewer than Concurrency workers take
// turns at the lock, and every record is still handled once. (That blocked
// records hold back none of the others under the cap is
// TestBlockedAfterCheapRecordsHoldBackNoOthers.)
func TestCheapHandlerKeepsFewWorkersAwake(t *testing.T) {
	c := newFakeCluster(t, notPorted, "cheapawake", 4)
	const n = 40000
	workers := max(32, 4*runtime.GOMAXPROCS(0))
	l := invariant.New(invariant.ByKey, n)
	produce(t, c, "cheapawake", n, n, l.Produced)
	cons, err := New(HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		l.Handled(r)
		return nil
	}), append(testOpts(c, "cheapawake", "cheapawake"), Ordering(Unordered), Concurrency(workers))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, l.AllHandled(), 30*time.Second, "every record")
	e := cons.eng
	e.mu.Lock()
	held := e.awake.held
	e.mu.Unlock()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rep := l.Report(); rep.Handled != n || rep.Duplicates != 0 {
		t.Fatalf("%+v, want %d handled once each", rep, n)
	}
	if held == 0 {
		t.Fatal("the cap never held a wake-up back")
	}
}
