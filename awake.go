package kpar

import (
	"math"
	"runtime"
	"time"
)

// While the handler is cheap (cost.go), at most
// GOMAXPROCS workers are awake: more cannot run at once, and every extra
// one only queues at the engine's lock. In kpar bench noop all 64 default
// workers stayed awake, since each that takes a record while others are
// ready wakes the next (see wake), and in key mode goroutines spent
// 40-340 ms blocked on the lock in a run of about 350 ms; with the cap,
// 1-50 ms, and the process's CPU per record fell by 25-40 ns
// (BENCHMARKS.md, eighth pass).
//
// A worker in a handler still counts as awake, so a cheap handler that
// blocks now and then (a slow call, a lock) must not leave records waiting
// while the awake workers are all stuck in it. The stuck guard sees to
// that: while the cap holds back a wake-up it ticks every awakeTick, and
// each tick counts the workers that have been running one record since
// the tick before last, a millisecond or more. The cap does not count
// those, so a record waits behind stuck handlers two ticks at most before
// an idle worker takes it. And a worker whose records turn slow ends the
// cap for every worker until one measures them cheap again.

// awakeTick is the stuck guard's period.
const awakeTick = time.Millisecond

// awakeState is the cap's bookkeeping, in engine, guarded by engine.mu.
type awakeState struct {
	limit int // GOMAXPROCS, when cheap
	stuck int // workers running one record for over a tick, at the last tick
	held  int // wake-ups the cap held back and workers it put to sleep, for tests
	tick  uint32
	guard *time.Timer
}

func newAwakeState() awakeState { return awakeState{limit: runtime.GOMAXPROCS(0)} }

// slotRecord is what a worker slot runs now: the record, for stuck
// reports, and the guard's tick when it took it. Zero between records.
type slotRecord struct {
	t    *task
	tick uint32
}

// awakeExcess is how many awake workers are beyond the cap: 0 when it
// allows no more, below 0 when it has room (always, while the handler is
// not cheap). Called with mu held.
func (e *engine) awakeExcess() int {
	a := &e.awake
	if !e.cost.Cheap() {
		return math.MinInt
	}
	return e.cfg.concurrency - e.idle - (a.limit + a.stuck)
}

// capped notes a wake-up the cap held back, or a worker it put to sleep
// with records ready, arming the stuck guard. Called with mu held.
func (e *engine) capped() {
	e.awake.held++
	if e.awake.guard == nil && !e.stop {
		e.awake.guard = time.AfterFunc(awakeTick, e.guardTick)
	}
}

// guardTick counts the stuck workers and wakes one if records wait and
// the cap, not counting them, allows it. wake re-arms the guard while the
// cap still holds one back.
func (e *engine) guardTick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := &e.awake
	a.guard = nil
	if e.stop {
		return
	}
	a.tick++
	a.stuck = 0
	watch := false // a wide lane's running record has records parked behind it
	for _, r := range e.running {
		if r.t == nil {
			continue
		}
		ps, run := r.t.Value.part, r.t.Value.run
		parked := r.t.Wide() && ps.wide && (ps.lanes.WideParked() > 0 || run != nil && run.left() > 0)
		if run != nil {
			watch = true // until the run ends: its record may turn out stuck
		}
		switch {
		case a.tick-r.tick >= 2:
			a.stuck++
			if run != nil && ps.status != dropped {
				// The records it ran before this one finished: the
				// window start and the stuck report move to this one.
				e.markRun(r.t, run.claimed()-1)
			}
			if parked {
				e.split(ps, false) // its partition's other keys must not wait for it
			}
		case parked && e.ready.Len() == 0 && e.idle > 0 && e.awakeExcess() < 0:
			e.split(ps, false) // an idle worker may share the partition's records
		case parked:
			watch = true
		}
	}
	e.wake(e.ready.Len())
	if watch && a.guard == nil {
		a.guard = time.AfterFunc(awakeTick, e.guardTick)
	}
}

// stopGuard stops the stuck guard at shutdown. Called with mu held.
func (e *engine) stopGuard() {
	if e.awake.guard != nil {
		e.awake.guard.Stop()
		e.awake.guard = nil
	}
}
