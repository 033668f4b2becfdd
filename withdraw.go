package kpar

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/window"
)

// Withdrawing. When a share group member stops, the records it holds and
// has not started go back to the group (RELEASE) for another member, rather
// than keeping the member until it ran them all; those the source keeps
// (a record on its last delivery, which a RELEASE would have the broker
// archive unseen) run as usual. withdrawAll marks every partition
// withdrawing; from then on a record of such a partition is withdrawn when
// its turn comes, from the ready queue (take) or after a failed attempt
// (finish), and withdrawAll takes out at once what would not start soon.
// The drain waits for records withdrawn as for records finished.

// withdrawAll begins a share group member's shutdown: it marks every
// partition withdrawing, and withdraws at once what does not start soon:
// records held outside a full window, parked behind their lane's record in
// flight, waiting for a retry, or waiting in the ready queue (without
// waiting for a worker or a rate limit's token).
func (e *engine) withdrawAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ps := range e.parts {
		if ps.status != live {
			continue
		}
		ps.status = withdrawing
		e.withdrawHeld(ps)
		var parked []*task
		ps.lanes.Withdraw(e.keepTask, func(t *task) { parked = append(parked, t) })
		for _, t := range parked {
			e.withdraw(t) // out of its lane already: it hands nothing over
		}
	}
	e.retries.Forget(func(t *task) bool { return !e.keepTask(t) && t.Value.part.status == withdrawing },
		func(t *task, tm *time.Timer) { tm.Stop(); e.retryNow(t) })
	var stay []*task
	for t := e.ready.Pop(); t != nil; t = e.ready.Pop() {
		if t.Value.part.status != withdrawing || e.keepTask(t) {
			stay = append(stay, t)
			continue
		}
		if next := e.withdraw(t); next != nil {
			e.ready.Push(next) // popped in turn
		}
	}
	for _, t := range stay {
		e.ready.Push(t)
	}
	e.wake(e.ready.Len())
}

// withdrawHeld withdraws the records ps holds outside its window (in a
// full window's wait, or MaxBufferedBytes'), but those the source keeps,
// which stay held. Called with mu held.
func (e *engine) withdrawHeld(ps *partState) {
	var kept heldQueue
	var size int64
	n := 0
	ps.held.take(ps.held.Len(), func(recs []*kgo.Record, meta []recMeta) {
		for i, r := range recs {
			if e.keep(r) {
				kept.push(recs[i:i+1], meta[i:i+1])
				continue
			}
			e.outcomes.Released(r)
			size += meta[i].size
			n++
		}
	})
	ps.held = kept
	if n > 0 {
		e.releaseRecords(ps, size, n)
	}
	// Records waiting for MaxBufferedBytes were never admitted: released
	// without returning budget, or, those the source keeps, admitted now.
	var keptRecs []*kgo.Record
	var keptMeta []recMeta
	released := 0
	ps.over.take(ps.over.Len(), func(recs []*kgo.Record, meta []recMeta) {
		for i, r := range recs {
			if e.keep(r) {
				e.buf.Admit(&ps.buf, meta[i].size)
				keptRecs, keptMeta = append(keptRecs, r), append(keptMeta, meta[i])
				continue
			}
			e.outcomes.Released(r)
			released++
		}
	})
	if ps.buf.SetOver(false) {
		e.syncPause(ps)
	}
	if len(keptRecs) > 0 {
		e.place(ps, keptRecs, keptMeta, ps.fetched)
	}
	if n+released > 0 {
		e.askCommit()
	}
}

// keepTask reports whether the source keeps a record of t (see
// engine.keep). Called with mu held.
func (e *engine) keepTask(t *task) bool {
	if run := t.Value.run; run != nil && run.recs != nil {
		_, end := unpackRun(run.state.Load())
		for _, r := range run.recs[run.marked:end] {
			if e.keep(r) {
				return true
			}
		}
		return false
	}
	return t.Value.rec != nil && e.keep(t.Value.rec)
}

// withdraw takes t out of the pipeline without running it again: its
// records are queued for the source to release, its window entries and
// budget free, its lane passes on; it returns the lane's next task, as
// complete does. t is unstarted (a run no worker took), or failed and not
// to be retried here. Called with mu held.
func (e *engine) withdraw(t *task) (next *task) {
	ps := t.Value.part
	if run := t.Value.run; run != nil {
		// No worker took the run: every record it still holds is ours.
		_, end := run.cut(0)
		var size int64
		for i := run.marked; i < end; i++ {
			ps.win.Done(t.Value.seq + window.Seq(i))
			size += run.meta[i].size
			e.outcomes.Released(run.recs[i])
		}
		n := end - run.marked
		run.marked = end
		e.releaseRecords(ps, size, n)
		t.Value.rec, run.recs = nil, nil
	} else {
		ps.win.Done(t.Value.seq)
		e.outcomes.Released(t.Value.rec)
		e.release(ps, t)
	}
	e.askCommit()
	next = ps.lanes.Release(t)
	e.refill(ps)
	return next
}
