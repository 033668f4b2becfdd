package kpar

import (
	"hash/maphash"
)

// Wide lanes. While the handler is tiny (cost.go), a partition
// in key or unordered mode orders its records (in key mode, its keyed
// ones) on one lane, the wide lane, as partition mode does: each record
// then runs after the one before it, and the worker that finishes one runs
// the next itself (see runEach), with no lane per key to create and
// delete, no ready queue and no wake-up in between. Per-key order holds,
// since records of a key are records of its partition, and unordered
// records may run in any order. Parallelism within a partition buys
// nothing while the bookkeeping costs more than the handler: in kpar bench
// noop key mode spent about 50-70 ns less CPU per record this way
// (BENCHMARKS.md, ninth pass). Across partitions the workers run in
// parallel as before.
//
// A partition leaves its wide lane (split) as soon as a record of another
// key would wait for no reason:
//   - a record of the wide lane fails: it retries on its key's lane alone;
//   - the stuck guard (awake.go) sees the lane's running record run for a
//     tick or more with records parked behind it, or a worker the cap
//     allows sitting idle while records are parked: one busy partition
//     among idle ones must not be run by one worker, and a handler that
//     turned slow leaves workers idle within a tick.
//
// Split moves every parked record onto its key's lane in order, so none
// overtakes an earlier record of its key (unordered ones become ready). A
// partition opens its wide lane again only when no lane of it is busy:
// then no earlier record of any key is unfinished, and records entering
// the wide lane cannot overtake one. After a failure, and after any split
// in unordered mode (where nothing else holds the lane off), it first
// admits four windows of records to key lanes (or to none), so that a
// partition whose records fail, block or need more than one worker does
// not split again and again. (Before that hold and the lower threshold,
// kpar bench cpu with one partition and a 10µs handler measured
// 1.36-1.72x raw in unordered mode against 1.52-1.65x before wide lanes;
// holding key mode off as well left a tenth of a noop run's records on
// key lanes.)
//
// While a worker measures the handler as not tiny, no wide lane
// opens. The lanes already open are not split on that measure alone: one
// run of records preempted on a busy machine measures slow too, and the
// guard splits within a tick wherever a split lets more records run.

// admitKeyed admits a record of a key-mode (keyed) or unordered partition
// to its wide lane, or else to its key's lane or none, and reports whether
// it may run now. Called with mu held.
func (e *engine) admitKeyed(ps *partState, t *task) bool {
	if !ps.wide && !ps.openWide(e.cost.TinyOrUnmeasured()) {
		return e.cfg.ordering == Unordered || ps.lanes.Admit(t, t.Value.laneOf(e.seed))
	}
	if ps.lanes.AdmitWide(t) {
		return true
	}
	e.armGuard() // the stuck guard watches: parked behind the lane's running record
	return false
}

// openWide opens ps's wide lane if the handler is tiny (or not measured
// yet) and no lane of ps is busy. Called with mu held.
func (ps *partState) openWide(tiny bool) bool {
	if !tiny || ps.lanes.Busy() != 0 {
		return false
	}
	if ps.wideHold > 0 {
		ps.wideHold--
		return false
	}
	ps.wide = true
	return true
}

// split closes ps's wide lane: its records move onto their keys' lanes,
// and those free to run are made ready; failed says a record of the lane
// failed. Called with mu held.
func (e *engine) split(ps *partState, failed bool) {
	if !ps.wide {
		return
	}
	ps.wide = false
	if failed || e.cfg.ordering == Unordered {
		ps.wideHold = 4 * e.cfg.windowRecords
	}
	// Runs give back the records they did not start, to split with the
	// others.
	ps.lanes.ExpandWide(e.giveBack)
	before := e.ready.Len()
	if e.cfg.ordering == Unordered {
		ps.lanes.Split(noLane, e.ready.Push)
	} else {
		ps.lanes.Split(func(t *task) (uint64, bool) { return keyLane(t, e.seed) }, e.ready.Push)
	}
	e.wake(e.ready.Len() - before)
}

// keyLane is a task's key lane for Split, hashed with seed; a record
// without a key (a run gives such records back) needs none.
func keyLane(t *task, seed maphash.Seed) (uint64, bool) { l := t.Value.laneOf(seed); return l, l != 0 }
func noLane(*task) (uint64, bool)                       { return 0, false }

// unhashed is the lane of a keyed record whose key prepare left unhashed.
const unhashed = 1

// laneOf returns the hash of it's key with seed, hashing it the first
// time it is needed (see prepare). Called with mu held.
func (it *item) laneOf(seed maphash.Seed) uint64 {
	if it.lane == unhashed {
		it.lane = max(maphash.Bytes(seed, it.rec.Key), unhashed+1)
	}
	return it.lane
}
