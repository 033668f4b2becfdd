package kpar

import "time"

// Key mode's wide lanes. While the handler is cheap, a partition in key
// mode orders all its keyed records on one lane, the wide lane, as
// partition mode does: each record then runs after the one before it, and
// the worker that finishes one runs the next itself (see runEach), with no
// lane per key to create and delete, no ready queue and no wake-up in
// between. Per-key order holds, since records of a key are records of its
// partition. Parallelism within a partition buys nothing while the
// bookkeeping costs more than the handler: in kpar bench noop key mode
// spent about 60 ns less CPU per record this way and rose from 0.85x to
// 0.91x raw (BENCHMARKS.md, ninth pass). Across partitions the workers run
// in parallel as before.
//
// A partition leaves its wide lane (split) as soon as a record of another
// key would wait for no reason:
//   - a record of the wide lane fails: it retries on its key's lane alone;
//   - the stuck guard (awake.go) sees the lane's running record run for a
//     tick or more with records parked behind it, or a worker the cap
//     allows sitting idle while records are parked (one busy partition
//     among idle ones must not be run by one worker);
//   - a worker measures the handler slow (fastHandler or more).
//
// Split moves every parked record onto its key's lane in order, so none
// overtakes an earlier record of its key. A partition opens its wide lane
// again only when no lane of it is busy: then no earlier record of any key
// is unfinished, and records entering the wide lane cannot overtake one.
// After a failure it first admits four windows of records to key lanes,
// so that a partition with many failing records does not split again and
// again.

// wideLanes reports whether the engine's records may use wide lanes at all:
// key mode with a per-record handler and no rate limit (a batch handler
// batches by key lane, and a key's rate is set per key).
func (e *engine) wideLanes() bool {
	return e.cfg.ordering == ByKey && e.batch == nil && e.rate == nil
}

// admitKeyed admits a keyed record of a key-mode partition to its wide lane
// or to its key's lane, and reports whether it may run now. Called with mu
// held.
func (e *engine) admitKeyed(ps *partState, t *task) bool {
	if !ps.wide && !e.openWide(ps) {
		return ps.lanes.Admit(t, t.Value.lane)
	}
	if ps.lanes.AdmitWide(t) {
		return true
	}
	e.watchWide() // parked behind the lane's running record
	return false
}

// openWide opens ps's wide lane if the handler is cheap (or not measured
// yet) and no lane of ps is busy. Called with mu held.
func (e *engine) openWide(ps *partState) bool {
	if !e.wideOK || (e.awake.measured && !e.awake.cheap) || ps.lanes.Busy() != 0 {
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
// and those free to run are made ready. hold is how many records ps then
// admits to key lanes before the wide lane may open again. Called with mu
// held.
func (e *engine) split(ps *partState, hold int) {
	if !ps.wide {
		return
	}
	ps.wide = false
	ps.wideHold = hold
	before := e.ready.Len()
	ps.lanes.Split(taskKey, e.ready.Push)
	e.wake(e.ready.Len() - before)
}

func taskKey(t *task) uint64 { return t.Value.lane }

// splitAll closes every wide lane: the handler turned slow. Called with mu
// held.
func (e *engine) splitAll() {
	for _, ps := range e.parts {
		e.split(ps, 0)
	}
}

// watchWide arms the stuck guard while records wait behind a wide lane's
// running record. Called with mu held.
func (e *engine) watchWide() {
	if e.awake.guard == nil && !e.stop {
		e.awake.guard = time.AfterFunc(awakeTick, e.guardTick)
	}
}
