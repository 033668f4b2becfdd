package kpar

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kpar/kpar/internal/awake"
	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/twmb/franz-go/pkg/kgo"
)

// wideEngine is a key-mode engine's scheduling state, the handler measured
// cheap and idle of its four workers idle, with one partition whose keys
// (hashes 2, 3, 2, 4) entered its wide lane: the first is running in
// worker slot 0, the other three wait behind it.
func wideEngine(t *testing.T, idle int) (*engine, *partState, []*task) {
	t.Helper()
	e, ps, ts := wideEngineReady(t, idle)
	e.mu.Lock()
	newWorker(e, 0).runs(e.ready.Pop())
	e.mu.Unlock()
	return e, ps, ts
}

// wideEngineReady is wideEngine before a worker took the first record: it
// is still ready.
func wideEngineReady(t *testing.T, idle int) (*engine, *partState, []*task) {
	t.Helper()
	const workers = 4
	e := testEngine(func(c *cfg) { c.concurrency, c.ordering, c.windowRecords = workers, ByKey, 1000 })
	e.awake = awake.New(2)
	for range idle {
		e.awake.Sleep()
	}
	e.cost.Measured(time.Microsecond)
	ps := &partState{tp: tp{topic: "t"}}
	e.parts[ps.tp] = ps
	var ts []*task
	e.mu.Lock() // the stuck guard's timer reads what schedule writes
	defer e.mu.Unlock()
	for _, key := range []uint64{2, 3, 2, 4} {
		tk := &task{}
		tk.Value.part, tk.Value.lane = ps, key
		e.schedule(tk)
		ts = append(ts, tk)
	}
	if e.ready.Len() != 1 || ps.lanes.WideParked() != 3 || !ps.wide {
		t.Fatalf("ready %d, parked %d, wide %v; want the first record ready and three parked on the wide lane",
			e.ready.Len(), ps.lanes.WideParked(), ps.wide)
	}
	return e, ps, ts
}

// readyKeys pops the ready records and returns their keys.
func readyKeys(e *engine) []uint64 {
	var keys []uint64
	for t := e.ready.Pop(); t != nil; t = e.ready.Pop() {
		keys = append(keys, t.Value.lane)
	}
	return keys
}

// TestWideLaneSplitsBehindAStuckRecordOrForAnIdleWorker: the stuck guard
// splits a wide lane whose running record has run for two ticks, or at
// once when a worker the cap allows is idle; the records of other keys
// become ready, and the one of the running record's key still waits for
// it. While the handler measures wideHandler or more, no wide lane opens.
func TestWideLaneSplitsBehindAStuckRecordOrForAnIdleWorker(t *testing.T) {
	tick := func(t *testing.T, e *engine) {
		t.Helper()
		time.Sleep(awake.Tick)
		synctest.Wait()
	}
	stopGuard := func(e *engine) {
		e.mu.Lock()
		e.stop = true
		e.stopGuard()
		e.mu.Unlock()
	}
	check := func(t *testing.T, e *engine, ps *partState, ts []*task) {
		t.Helper()
		e.mu.Lock()
		defer e.mu.Unlock()
		if ps.wide || ps.lanes.WideParked() != 0 {
			t.Fatalf("wide %v, parked on the wide lane %d; want the lane split", ps.wide, ps.lanes.WideParked())
		}
		if got := readyKeys(e); len(got) != 2 || got[0] != 3 || got[1] != 4 {
			t.Fatalf("ready keys %v, want [3 4]: the second record of key 2 waits for the running one", got)
		}
		if next := ps.lanes.Release(ts[0]); next != ts[2] {
			t.Fatalf("releasing the running record handed over %v, want the second record of its key", next)
		}
	}

	t.Run("stuck", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e, ps, ts := wideEngine(t, 0) // every worker busy: none to share the partition
			tick(t, e)
			e.mu.Lock()
			if !ps.wide || e.guard == nil {
				t.Fatalf("after one tick: wide %v, guard armed %v; want the lane kept and the guard watching", ps.wide, e.guard != nil)
			}
			e.mu.Unlock()
			tick(t, e)
			check(t, e, ps, ts)
			stopGuard(e)
		})
	})
	t.Run("idle worker", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e, ps, ts := wideEngine(t, 3) // one awake of the cap's two
			tick(t, e)
			check(t, e, ps, ts)
			stopGuard(e)
		})
	})
	t.Run("guard armed when the first record starts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e, ps, ts := wideEngineReady(t, 0) // every worker busy elsewhere
			// Nothing runs on the wide lane: the guard stops.
			tick(t, e)
			e.mu.Lock()
			if e.guard != nil || !ps.wide {
				t.Fatalf("guard armed %v, wide %v; want the guard stopped and the lane kept", e.guard != nil, ps.wide)
			}
			newWorker(e, 0).runs(e.ready.Pop())
			if e.guard == nil {
				t.Fatal("the wide lane's first record started with records behind it and the guard not armed")
			}
			e.mu.Unlock()
			tick(t, e)
			tick(t, e)
			check(t, e, ps, ts)
			stopGuard(e)
		})
	})
	t.Run("handler of 10µs", func(t *testing.T) {
		e := testEngine(func(c *cfg) { c.concurrency, c.ordering, c.windowRecords = 4, ByKey, 1000 })
		e.awake = awake.New(2)
		ps := &partState{tp: tp{topic: "t"}}
		e.cost.Measured(10 * time.Microsecond) // cheap for the awake cap, not tiny
		for _, key := range []uint64{2, 3} {
			tk := &task{}
			tk.Value.part, tk.Value.lane = ps, key
			e.schedule(tk)
			if ps.wide || tk.Wide() {
				t.Fatal("a record entered a wide lane while the handler measures 10µs a record")
			}
		}
		if e.ready.Len() != 2 {
			t.Fatalf("ready %d, want both records of their own keys", e.ready.Len())
		}
	})
}

// TestRetryingRecordHoldsBackOnlyItsKey: in key mode, after thousands of
// cheap records (so the partition runs its wide lane), a record that keeps
// failing holds back the later records of its key and no other: every
// other record of its partition is handled while it retries, and per-key
// order holds once it succeeds. In unordered mode it holds back nothing.
func TestRetryingRecordHoldsBackOnlyItsKey(t *testing.T) {
	for _, mode := range []struct {
		order Order
		check invariant.Order
	}{{ByKey, invariant.ByKey}, {Unordered, invariant.Unordered}} {
		t.Run(mode.order.String(), func(t *testing.T) {
			c := newFakeCluster(t, notPorted, "wide", 1)
			const warm, n, keys = 3000, 3500, 50
			l := invariant.New(mode.check, n)
			produce(t, c, "wide", warm, warm, l.Produced) // every record its own key
			release := make(chan struct{})
			h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
				if r.Offset == warm {
					select {
					case <-release:
					default:
						return errors.New("downstream refuses this one for now")
					}
				}
				l.Handled(r)
				return nil
			})
			cons, err := New(h, append(testOpts(c, "wide", "wide"), Ordering(mode.order),
				RetryBackoff(time.Millisecond, 5*time.Millisecond))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			waitFor(t, l.Reached(warm), 20*time.Second, "the cheap records")
			// Record warm has key 0 of the next range, as every 50th after it.
			produceRange(t, c, nameIn(c, "wide"), warm, n, keys, l.Produced)
			others := int64(n - 1)
			if mode.order == ByKey {
				others = n - (n-warm)/keys
			}
			waitFor(t, l.Reached(others), 20*time.Second, "every record that need not wait for the failing one")
			close(release)
			waitFor(t, l.AllHandled(), 20*time.Second, "the failing key's records")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if err := l.Report().Check(0); err != nil {
				t.Fatal(err)
			}
		})
	}
}
