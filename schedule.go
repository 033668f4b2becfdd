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

// wake makes sure an idle worker runs when n records became ready. Called
// with mu held.
//
// It wakes one, and only when no other wake-up is still on its way: a
// woken worker that leaves ready records behind wakes the next once it
// runs (see take). So at most one worker is runnable without having run,
// and the ramp goes as fast as woken workers get a CPU. Without that
// rule every finish and take signalled another sleeper before the last
// one ran: an execution trace of kpar bench noop found some 25 workers
// runnable on average, on two cores. While the handler is cheap it wakes
// none beyond GOMAXPROCS awake workers (awake.go).
func (e *engine) wake(n int) {
	if n > 0 && e.idle > 0 && !e.waking {
		if e.awakeExcess() >= 0 {
			e.capped()
			return
		}
		e.idle--
		e.waking = true
		e.cond.Signal()
	}
}
