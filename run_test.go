package kpar

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kpar/kpar/internal/awake"
	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/kpar/kpar/internal/window"
	"github.com/twmb/franz-go/pkg/kgo"
)

// runEngine is the scheduling state of an engine whose handler measured
// tiny, with every one of its four workers busy, and one partition that
// received the records of lanes (key hashes, 0 for none) at offsets 0, 1,
// ..., entered as runs.
func runEngine(t *testing.T, order Order, lanes ...uint64) (*engine, *partState) {
	t.Helper()
	const workers = 4
	e := testEngine(func(c *cfg) { c.concurrency, c.ordering, c.windowRecords = workers, order, 1000 })
	e.awake = awake.New(2)
	e.cost.Measured(time.Microsecond)
	ps := &partState{tp: tp{topic: "t"}, win: window.New(1000), committed: -1}
	e.parts[ps.tp] = ps
	recs := make([]*kgo.Record, len(lanes))
	meta := make([]recMeta, len(lanes))
	for i, lane := range lanes {
		recs[i] = &kgo.Record{Topic: "t", Offset: int64(i)}
		meta[i] = recMeta{offset: int64(i), size: 1, lane: lane}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for range lanes {
		e.buf.Admit(&ps.buf, 1)
	}
	e.enterRecords(ps, recs, meta)
	return e, ps
}

// takeRun has worker slot 0 take the ready run and start its first n
// records: the last of them runs now.
func takeRun(t *testing.T, e *engine, n int) *task {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	rt := e.ready.Pop()
	if rt == nil || rt.Value.run == nil {
		t.Fatalf("ready %v; want one run", rt)
	}
	rt.Value.part.running++
	newWorker(e, 0).runs(rt)
	for range n {
		if _, ok := rt.Value.run.claim(); !ok {
			t.Fatal("the run has too few records")
		}
	}
	return rt
}

// twoGuardTicks lets the stuck guard tick twice, in a synctest bubble:
// a record that ran through both is stuck.
func twoGuardTicks() {
	for range 2 {
		time.Sleep(awake.Tick)
		synctest.Wait()
	}
}

func offsetsOf(ts []*task) []int64 {
	var out []int64
	for _, t := range ts {
		out = append(out, t.Value.rec.Offset)
	}
	return out
}

// TestRunGivesBackBehindAStuckRecord: in key mode a run whose record runs
// for two ticks has the records it ran before marked finished (the window
// start names the running record), and gives back the records it did not
// start when the wide lane splits: those of other keys run at once, the
// one of the running record's key waits for it, and the run's worker
// starts none of them.
func TestRunGivesBackBehindAStuckRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, ps := runEngine(t, ByKey, 2, 3, 2, 4, 3, 0)
		rt := takeRun(t, e, 2) // record 0 ran, record 1 (key 3) runs
		twoGuardTicks()

		e.mu.Lock()
		defer e.mu.Unlock()
		if start, _ := ps.win.Start(); start != 1 {
			t.Fatalf("window start %d, want 1: the record the worker ran before the stuck one finished", start)
		}
		if ps.wide {
			t.Fatal("the wide lane did not split behind the stuck run")
		}
		var ready []*task
		for r := e.ready.Pop(); r != nil; r = e.ready.Pop() {
			ready = append(ready, r)
		}
		if got := offsetsOf(ready); !slices.Equal(got, []int64{2, 3, 5}) {
			t.Fatalf("ready offsets %v, want [2 3 5]: keys 2 and 4 and the record without a key", got)
		}
		if _, ok := rt.Value.run.claim(); ok {
			t.Fatal("the run's worker may still start a record it gave back")
		}
		next := e.finishRun(rt, 2, nil, false, 0, time.Now())
		if next == nil || next.Value.rec.Offset != 4 {
			t.Fatalf("finishing the run handed over %v, want offset 4, the next record of its key", next)
		}
		if start, _ := ps.win.Start(); start != 2 {
			t.Fatalf("window start %d after the run finished, want 2", start)
		}
		e.stop = true
		e.stopGuard()
	})
}

// TestRunFailsAfterTheGuardSplit: a run's record fails, and the stuck
// guard splits the wide lane before the worker takes the lock to finish
// it. The run's records after the failed one are the split's to give
// back, and keep their order: the failed record keeps its key's lane, the
// later record of that key waits behind it, the other keys run. (The
// worker used to take them out of the run before it locked; the split
// then found none, and finishing the run panicked in sched.Replace.)
func TestRunFailsAfterTheGuardSplit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, ps := runEngine(t, ByKey, 2, 3, 2, 4, 3, 0)
		rt := takeRun(t, e, 2) // record 0 ran, record 1 (key 3) runs and fails
		// One more record of key 2 waits on the wide lane.
		e.mu.Lock()
		e.buf.Admit(&ps.buf, 1)
		e.enterRecords(ps, []*kgo.Record{{Topic: "t", Offset: 6}}, []recMeta{{offset: 6, size: 1, lane: 2}})
		e.mu.Unlock()
		twoGuardTicks()

		e.mu.Lock()
		defer e.mu.Unlock()
		if ps.wide {
			t.Fatal("the wide lane did not split behind the stuck run")
		}
		e.running[0] = slotRecord{}
		if next := e.finishRun(rt, 1, errors.New("boom"), false, time.Hour, time.Now()); next != nil {
			t.Fatalf("finishing the failed run handed over offset %d; want nothing: its key waits for the retry", next.Value.rec.Offset)
		}
		var ready []*task
		for r := e.ready.Pop(); r != nil; r = e.ready.Pop() {
			ready = append(ready, r)
		}
		if got := offsetsOf(ready); !slices.Equal(got, []int64{2, 3, 5}) {
			t.Fatalf("ready offsets %v, want [2 3 5]: keys 2 and 4 and the record without a key", got)
		}
		if start, _ := ps.win.Start(); start != 1 {
			t.Fatalf("window start %d, want 1, the failed record", start)
		}
		e.stop = true
		e.stopGuard()
	})
}

// TestRunGivesBackWhenItsPartitionIsRevoked: the worker of a revoked
// partition's run starts none of its records left; they stay unfinished
// for the next owner.
func TestRunGivesBackWhenItsPartitionIsRevoked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, ps := runEngine(t, ByPartition, 0, 0, 0, 0)
		rt := takeRun(t, e, 1)
		e.mu.Lock()
		ps.status = revoking
		e.stopRuns(ps)
		if _, ok := rt.Value.run.claim(); ok {
			t.Fatal("the run of a revoked partition may still start a record")
		}
		e.running[0] = slotRecord{}
		e.finishRun(rt, 1, nil, false, 0, time.Now())
		if start, _ := ps.win.Start(); start != 1 || ps.win.Pending() != 3 {
			t.Fatalf("window start %d with %d pending, want 1 and 3: the records the run did not start stay unfinished",
				start, ps.win.Pending())
		}
		e.stop = true
		e.stopGuard()
		e.mu.Unlock()
	})
}

// TestRunsFailInPlace: with a tiny handler, records enter as runs in every
// ordering mode, and records of runs that fail now and then (once each, or
// several times) are retried in their place: nothing is lost or handled
// twice, and per-key or per-partition order holds.
func TestRunsFailInPlace(t *testing.T) {
	for _, mode := range []struct {
		order Order
		check invariant.Order
	}{{ByKey, invariant.ByKey}, {ByPartition, invariant.ByPartition}, {Unordered, invariant.Unordered}} {
		t.Run(mode.order.String(), func(t *testing.T) {
			c := newFakeCluster(t, notPorted, "runs", 2)
			const n, keys = 20000, 300
			l := invariant.New(mode.check, n)
			produce(t, c, "runs", n, keys, l.Produced)
			var mu sync.Mutex
			failures := map[[2]int64]int{}
			h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
				if r.Offset%997 == 500 {
					mu.Lock()
					k := [2]int64{int64(r.Partition), r.Offset}
					failures[k]++
					tries := failures[k]
					mu.Unlock()
					if tries <= 1+int(r.Offset/997)%3 {
						return errors.New("downstream refuses this one for now")
					}
				}
				l.Handled(r)
				return nil
			})
			cons, err := New(h, append(testOpts(c, "runs", "runs"), Ordering(mode.order),
				RetryBackoff(time.Millisecond, 5*time.Millisecond))...)
			if err != nil {
				t.Fatal(err)
			}
			// Tiny as measured without -race on an idle machine: records
			// enter as runs once a worker measured it.
			cons.cfg.pinnedCost = time.Microsecond
			stop := runConsumer(t, cons)
			waitFor(t, l.AllHandled(), 30*time.Second, "every record")
			cons.last.mu.Lock()
			runs := cons.last.runsEntered
			cons.last.mu.Unlock()
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if runs == 0 {
				t.Fatal("no record entered as part of a run")
			}
			if err := l.Report().Check(0); err != nil {
				t.Fatal(err)
			}
		})
	}
}
