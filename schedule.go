package kpar

import "time"

// schedule makes t ready, or parks it behind its key or partition.
func (e *engine) schedule(t *task) {
	ps := t.Value.part
	if ps.level > 0 {
		// Retry topics are unordered: a retried record already left its
		// place in the original order.
		e.ready.Push(t)
		return
	}
	switch e.cfg.ordering {
	case ByPartition:
		if !ps.lanes.Admit(t, 0) {
			return
		}
	case ByKey:
		if t.Value.lane != 0 && !ps.lanes.Admit(t, t.Value.lane) {
			return
		}
	}
	e.ready.Push(t)
}

// wake makes sure an idle worker runs when n records became ready. Called
// with mu held.
//
// It wakes one: a woken worker that leaves ready records behind wakes the
// next (see take). Waking n at once would make n goroutines fight for mu
// on two cores; the chain ramps up just as fast when handlers are slow.
//
// When records are cheap (cheapHandler) and GOMAXPROCS of them run, it
// wakes none: the running workers take the ready records as they finish
// theirs, and the stall guard wakes one if they all block instead.
func (e *engine) wake(n int) {
	if n <= 0 || e.idle == 0 {
		return
	}
	if e.cheap && e.active >= e.procs {
		e.armStallGuard()
		return
	}
	e.cond.Signal()
}

// stallGuard is how long records may stay ready, with workers idle, after
// wake declined to wake one, before the guard checks that the running
// workers still finish records.
const stallGuard = time.Millisecond

// armStallGuard makes sure that ready records left to the cheap workers
// that run now get a worker of their own if those block: one handler call
// that turns slow must not hold back records that idle workers could run.
// Called with mu held.
func (e *engine) armStallGuard() {
	if e.guardArmed || e.stop {
		return
	}
	e.guardArmed, e.guardSeen = true, e.finished
	if e.guard == nil {
		e.guard = time.AfterFunc(stallGuard, e.stallGuardFired)
		return
	}
	e.guard.Reset(stallGuard)
}

// stallGuardFired wakes a worker if no record finished since the guard was
// armed: the running workers' handlers block, and the ready records wait.
// The woken worker arms the guard again when it leaves ready records
// behind, so that it is covered if it blocks as well.
func (e *engine) stallGuardFired() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.guardArmed = false
	if e.finished == e.guardSeen && !e.stop && e.ready.Len() > 0 && e.idle > 0 {
		e.cond.Signal()
	}
}
