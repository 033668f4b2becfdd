package kpar

import (
	"time"

	"github.com/kpar/kpar/internal/awake"
)

// The awake cap and the stuck guard: their state is internal/awake's Cap
// (e.awake), which says why they exist; here is the I/O, the guard's
// timer, and what a stuck record changes in the pipeline. A worker whose
// records turn slow ends the cap for every worker until one measures them
// cheap again (the cap holds only while the cost model says cheap).

// slotRecord is what a worker slot runs now: the record, for stuck
// reports, and the guard's tick when it took it. Zero between records.
type slotRecord struct {
	t    *task
	tick uint32
}

// awakeExcess is how many awake workers are beyond the cap: 0 when it
// allows no more, below 0 when it has room. Called with mu held.
func (e *engine) awakeExcess() int {
	return e.awake.Excess(e.cost.Cheap(), e.cfg.concurrency)
}

// armGuard arms the stuck guard's timer unless it is armed or the
// pipeline stops. Called with mu held.
func (e *engine) armGuard() {
	if e.guard == nil && !e.stop {
		e.guard = time.AfterFunc(awake.Tick, e.guardTick)
	}
}

// guardTick counts the stuck workers and wakes one if records wait and
// the cap, not counting them, allows it. wake re-arms the guard while the
// cap still holds one back.
func (e *engine) guardTick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := &e.awake
	e.guard = nil
	if e.stop {
		return
	}
	a.BeginTick()
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
		case a.Stuck(r.tick):
			if run != nil && ps.status != dropped {
				// The records it ran before this one finished: the
				// window start and the stuck report move to this one.
				e.markRun(r.t, run.claimed()-1)
			}
			if parked {
				e.split(ps, false) // its partition's other keys must not wait for it
			}
		case parked && e.ready.Len() == 0 && e.awake.Idle() > 0 && e.awakeExcess() < 0:
			e.split(ps, false) // an idle worker may share the partition's records
		case parked:
			watch = true
		}
	}
	e.wake(e.ready.Len())
	if watch {
		e.armGuard()
	}
}

// stopGuard stops the stuck guard at shutdown. Called with mu held.
func (e *engine) stopGuard() {
	if e.guard != nil {
		e.guard.Stop()
		e.guard = nil
	}
}
