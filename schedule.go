package kpar

import "github.com/kpar/kpar/internal/awake"

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
		// The wide lane is the partition's single lane (never split:
		// ps.wide stays false), but for the batch handler, which takes
		// a lane's records together (TakeNext).
		if e.batch == nil {
			if !ps.lanes.AdmitWide(t) {
				return
			}
		} else if !ps.lanes.Admit(t, 0) {
			return
		}
	case ByKey:
		if t.Value.lane != 0 && !e.admitKeyed(ps, t) {
			return
		}
	case Unordered:
		if e.cost.WideOK() && !e.admitKeyed(ps, t) {
			return
		}
	}
	e.ready.Push(t)
}

// wake makes sure an idle worker runs when n records became ready: one,
// when no other wake-up is on its way, and none beyond the awake cap
// (internal/awake decides; a woken worker that leaves ready records
// behind wakes the next once it runs, see take). Called with mu held.
func (e *engine) wake(n int) {
	switch e.awake.Wake(n, e.cost.Cheap(), e.cfg.concurrency) {
	case awake.Signal:
		e.cond.Signal()
	case awake.Held:
		e.armGuard()
	}
}
