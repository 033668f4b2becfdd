package kpar

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
func (e *engine) wake(n int) {
	if n > 0 && e.idle > 0 {
		e.cond.Signal()
	}
}
