package kpar

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/twmb/franz-go/pkg/kgo"
)

// wideEngine is a key-mode engine's scheduling state with one partition
// whose keys (1, 2, 1, 3) entered its wide lane: the first is running in
// worker slot 0, the other three wait behind it.
func wideEngine(t *testing.T, workers int) (*engine, *partState, []*task) {
	t.Helper()
	e := &engine{cfg: &cfg{concurrency: workers, ordering: ByKey, windowRecords: 1000},
		running: make([]slotRecord, workers), awake: awakeState{limit: 2}, wideOK: true, parts: map[tp]*partState{}}
	ps := &partState{tp: tp{"t", 0}}
	e.parts[ps.tp] = ps
	var ts []*task
	for _, key := range []uint64{1, 2, 1, 3} {
		tk := &task{}
		tk.Value.part, tk.Value.lane = ps, key
		e.schedule(tk)
		ts = append(ts, tk)
	}
	if e.ready.Len() != 1 || ps.lanes.WideParked() != 3 || !ps.wide {
		t.Fatalf("ready %d, parked %d, wide %v; want the first record ready and three parked on the wide lane",
			e.ready.Len(), ps.lanes.WideParked(), ps.wide)
	}
	e.running[0] = slotRecord{e.ready.Pop(), e.awake.tick}
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
// it. A handler measured slow splits every wide lane.
func TestWideLaneSplitsBehindAStuckRecordOrForAnIdleWorker(t *testing.T) {
	tick := func(t *testing.T, e *engine) {
		t.Helper()
		time.Sleep(awakeTick)
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
		if got := readyKeys(e); len(got) != 2 || got[0] != 2 || got[1] != 3 {
			t.Fatalf("ready keys %v, want [2 3]: the second record of key 1 waits for the running one", got)
		}
		if next := ps.lanes.Release(ts[0]); next != ts[2] {
			t.Fatalf("releasing the running record handed over %v, want the second record of its key", next)
		}
	}

	t.Run("stuck", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e, ps, ts := wideEngine(t, 4) // every worker busy: no idle one to share the partition
			e.measured(time.Microsecond)
			e.mu.Lock()
			e.watchWide()
			e.mu.Unlock()
			tick(t, e)
			e.mu.Lock()
			if !ps.wide || e.awake.guard == nil {
				t.Fatalf("after one tick: wide %v, guard armed %v; want the lane kept and the guard watching", ps.wide, e.awake.guard != nil)
			}
			e.mu.Unlock()
			tick(t, e)
			check(t, e, ps, ts)
			stopGuard(e)
		})
	})
	t.Run("idle worker", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e, ps, ts := wideEngine(t, 4)
			e.idle = 3 // one awake of the cap's two
			e.measured(time.Microsecond)
			e.mu.Lock()
			e.watchWide()
			e.mu.Unlock()
			tick(t, e)
			e.idle = 3 // the split woke one; count it idle again for check
			check(t, e, ps, ts)
			stopGuard(e)
		})
	})
	t.Run("slow handler", func(t *testing.T) {
		e, ps, ts := wideEngine(t, 4)
		e.measured(time.Microsecond)
		e.measured(time.Millisecond)
		check(t, e, ps, ts)
		e.mu.Lock()
		defer e.mu.Unlock()
		tk := &task{}
		tk.Value.part, tk.Value.lane = ps, 4
		e.schedule(tk)
		if ps.wide || tk.Wide() {
			t.Fatal("a record entered the wide lane while the handler measures slow")
		}
	})
}

// TestRetryingRecordHoldsBackOnlyItsKey: in key mode, after thousands of
// cheap records (so the partition runs its wide lane), a record that keeps
// failing holds back the later records of its key and no other: every
// other record of its partition is handled while it retries, and per-key
// order holds once it succeeds.
func TestRetryingRecordHoldsBackOnlyItsKey(t *testing.T) {
	c := newFakeCluster(t, notPorted, "wide", 1)
	const warm, n, keys = 3000, 3500, 50
	l := invariant.New(invariant.ByKey, n)
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
	cons, err := New(h, append(testOpts(c, "wide", "wide"), Ordering(ByKey), RetryBackoff(time.Millisecond, 5*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, l.Reached(warm), 20*time.Second, "the cheap records")
	// Record warm has key 0 of the next range, as every 50th after it.
	produceRange(t, c, nameIn(c, "wide"), warm, n, keys, l.Produced)
	waitFor(t, l.Reached(n-(n-warm)/keys), 20*time.Second, "every record of the other keys")
	close(release)
	waitFor(t, l.AllHandled(), 20*time.Second, "the failing key's records")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := l.Report().Check(0); err != nil {
		t.Fatal(err)
	}
}
