package kpar

import (
	"context"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/cost"
)

// maxTake bounds how many records a worker runs in a row, its key's
// successors included, before it updates its estimate of the handler's
// time and passes through the outer loop.
const maxTake = 64

func (e *engine) worker(ctx context.Context, slot int) {
	var (
		batch []*task
		recs  []*kgo.Record
		// perRecord estimates this worker's handler time per record.
		perRecord = time.Hour
	)
	e.mu.Lock()
	for {
		for (e.ready.Len() == 0 || e.limited() || e.awakeExcess() > 0) && !e.stop {
			if e.ready.Len() > 0 && e.awakeExcess() > 0 {
				// Asleep with records ready: the guard watches the rest.
				e.awake.Hold()
				e.armGuard()
			}
			e.awake.Sleep()
			e.cond.Wait()
			e.awake.Woken() // wake took this worker off idle
		}
		if e.stop {
			e.mu.Unlock()
			return
		}
		batch = e.take(batch[:0])
		if len(batch) == 0 {
			continue
		}
		if e.batch == nil {
			e.runs(slot, batch[0])
		}
		e.mu.Unlock()

		// Both return with mu held, so the last finish and the next take
		// share one lock round trip.
		if e.batch != nil {
			e.runBatch(ctx, slot, batch, &recs)
		} else {
			perRecord = e.runEach(ctx, slot, batch[0], perRecord)
			batch[0] = nil
			e.cost.Measured(perRecord)
		}
	}
}

// runEach runs the handler on first (taken and passed to runs by the
// caller), then on the records this worker takes next: one at a time, each
// taken in the lock round trip that finishes the one before, so a worker
// never holds a record that another could run while its handler is slow.
// It returns with mu held and the updated estimate of the handler's time
// per record.
func (e *engine) runEach(ctx context.Context, slot int, first *task, perRecord time.Duration) time.Duration {
	start := time.Now()
	// A fast handler's records share one attempt context and one clock
	// reading, which would otherwise cost more than the handler. If the
	// shared context is cancelled (the run went past AttemptTimeout), the
	// rest get contexts of their own.
	fast := cost.WorkerFast(perRecord)
	var shared *attemptCtx
	at := start
	ran, steps := 0, 0 // records run, and tasks (a run is one)
	t := first
	for {
		if shared == nil && ran > 0 {
			at = time.Now()
		}
		steps++
		var next *task
		if t.Value.run != nil {
			done, err, timedOut := e.runRun(ctx, slot, t, at, &shared, fast)
			ran += done
			var backoff time.Duration
			if err != nil {
				ran++
				backoff = e.observe(failedInRun(t, done), err)
			}
			e.mu.Lock()
			e.running[slot] = slotRecord{}
			next = e.finishRun(t, done, err, timedOut, backoff, at)
		} else {
			ran++
			e.stamp(t, at)
			err, timedOut := e.attempt(ctx, slot, t, t.Value.original(), at, &shared, fast)
			if err == errOutputsInFlight {
				// Its outputs' acknowledgement finishes it (outputs.go).
				e.mu.Lock()
				e.running[slot] = slotRecord{}
			} else {
				backoff := e.observe(t, err)
				e.mu.Lock()
				e.running[slot] = slotRecord{}
				next = e.finish(t, err, timedOut, backoff, at)
			}
		}
		if next != nil {
			if fast && steps < maxTake && !e.stop && next.Value.part.status == live && !e.limits.Rated() {
				// Run the key's (or partition's) next record here:
				// no queueing, no wake-up, no hand-off between workers.
				next.Value.part.running++
				e.limits.Took(1)
				t = next
				e.runs(slot, t)
				e.mu.Unlock()
				continue
			}
			e.ready.Push(next)
		}
		if steps >= maxTake || e.stop || e.ready.Len() == 0 {
			break
		}
		var one [1]*task
		taken := e.take(one[:0])
		if len(taken) == 0 {
			break
		}
		t = taken[0]
		e.runs(slot, t)
		e.mu.Unlock()
	}
	if shared != nil {
		e.slots[slot].Store(nil)
	}
	took := time.Since(start) / time.Duration(max(ran, 1))
	if perRecord > time.Minute {
		return took
	}
	return (perRecord*3 + took) / 4
}

// attempt runs the handler on r, the record of task t or one of t's run,
// from at: in the worker's shared attempt context while the handler is
// fast (and that context was not cancelled), else in one of its own.
// Called without mu.
func (e *engine) attempt(ctx context.Context, slot int, t *task, r *kgo.Record, at time.Time, shared **attemptCtx, fast bool) (err error, timedOut bool) {
	actx := *shared
	if actx == nil {
		actx = &attemptCtx{Context: ctx, deadline: at.Add(e.cfg.attemptTimeout), task: t, attempt: t.Value.attempts, emit: e.out != nil}
		e.slots[slot].Store(actx)
		if fast {
			*shared = actx
		}
	}
	err = callHandler(actx, e.handler, r)
	if e.out != nil {
		err = e.handOver(ctx, t, actx, at, err)
	}
	timedOut = err != nil && err != errOutputsInFlight && actx.timedOut()
	if actx != *shared || actx.Err() != nil {
		e.slots[slot].Store(nil)
		*shared = nil
	}
	return err, timedOut
}

// runBatch runs the batch handler once on every taken record and returns
// with mu held.
func (e *engine) runBatch(ctx context.Context, slot int, batch []*task, recs *[]*kgo.Record) {
	start := time.Now()
	*recs = (*recs)[:0]
	for _, t := range batch {
		e.dispatched(t, start)
		*recs = append(*recs, t.Value.original())
	}
	actx := &attemptCtx{Context: ctx, deadline: start.Add(e.cfg.attemptTimeout), task: batch[0], attempt: batch[0].Value.attempts, emit: e.out != nil}
	e.slots[slot].Store(actx)
	err := e.callBatch(actx, *recs)
	if e.out != nil {
		// The batch's outputs go with its last record, which finishes
		// with the others in one round of the lock below.
		err = e.emitted(ctx, batch[len(batch)-1], actx, err)
	}
	e.slots[slot].Store(nil)
	timedOut := err != nil && actx.timedOut()
	backoffs := make([]time.Duration, len(batch))
	for i, t := range batch {
		backoffs[i] = e.observe(t, err)
	}
	now := time.Now()
	e.mu.Lock()
	if err != nil && len(batch) > 1 && e.cfg.ordering != Unordered && isLaned(e.cfg.ordering, batch[0]) {
		// A failed batch of one lane is retried as it was: its first
		// record takes the failure (backoff, retry topic or dead letter)
		// holding the lane, the others go back in front of the lane, so
		// that no record of the key or partition overtakes another.
		ps := batch[0].Value.part
		ps.lanes.GiveBack(batch[0], batch[1:])
		ps.running -= len(batch) - 1
		e.limits.GaveBack(len(batch) - 1)
		clear(batch[1:])
		batch = batch[:1]
	}
	handedOver := 0
	for i, t := range batch {
		if next := e.finish(t, err, timedOut, backoffs[i], now); next != nil {
			e.ready.Push(next)
			handedOver++
		}
		batch[i] = nil
	}
	e.wake(handedOver - 1) // this worker takes one itself
	clear(*recs)
}

// take pops the record this worker runs next and marks it running: one,
// or, for the batch handler, a batch started by the first. It returns
// nothing when every ready record was set aside (revoked, not due yet, or
// waiting for its key's rate). When ready records remain it passes the
// wake-up on to an idle worker (see wake). Called with mu held.
func (e *engine) take(batch []*task) []*task {
	for len(batch) == 0 && !e.limited() {
		t := e.ready.Pop()
		if t == nil {
			break
		}
		ps := t.Value.part
		if ps.status != live {
			switch {
			case ps.status != withdrawing:
				continue // revoked: its new owner handles it
			case !e.keepTask(t):
				if next := e.withdraw(t); next != nil {
					e.ready.Push(next)
				}
				continue
			} // a record the source keeps at shutdown: it runs
		}
		if ps.level > 0 {
			if wait := time.Until(t.Value.x.due); wait > 0 {
				// Not due yet: wait on a timer, not on a worker. The
				// retry partition's window fills and pauses meanwhile.
				e.retryLater(t, wait)
				continue
			}
		}
		if e.keyWait(t) {
			continue // set aside until its key has a token (throttle.go)
		}
		ps.running++
		batch = append(batch, t)
		if e.batch != nil {
			batch = e.fillBatch(batch, t)
		}
		e.limits.Took(len(batch))
		if e.limits.Paced() {
			e.limits.Charge(time.Now(), len(batch))
		}
	}
	e.wake(e.ready.Len()) // there is more than this worker runs
	return batch
}

// limited reports whether the limits (internal/limits: the adaptive limit
// or the overload breaker, the global rate limit) let no attempt start
// now, arming the wake-up for when one may. Called with mu held.
func (e *engine) limited() bool {
	if !e.limits.Gated() {
		return false // the common case: no clock read per record
	}
	ok, wait := e.limits.Allow(time.Now())
	if !ok && wait > 0 && e.limitWake == nil {
		e.limitWake = time.AfterFunc(wait, func() {
			e.mu.Lock()
			e.limitWake = nil
			e.wake(1)
			e.mu.Unlock()
		})
	}
	return !ok
}

// fillBatch extends a batch started by first with the records that may run
// with it: the parked records of its lane in Key and Partition modes, the
// ready records of its partition that follow it in Unordered mode.
func (e *engine) fillBatch(batch []*task, first *task) []*task {
	ps := first.Value.part
	for len(batch) < e.cfg.batchSize {
		var next *task
		if e.cfg.ordering == Unordered || !isLaned(e.cfg.ordering, first) {
			if h := e.ready.Peek(); h != nil && h.Value.part == ps && !isLaned(e.cfg.ordering, h) {
				next = e.ready.Pop()
			}
		} else {
			next = ps.lanes.TakeNext(first)
		}
		if next == nil {
			break
		}
		ps.running++
		batch = append(batch, next)
	}
	return batch
}

func isLaned(o Order, t *task) bool {
	return t.Value.x == nil && (o == ByPartition || (o == ByKey && t.Value.lane != 0))
}

// runs marks t as the record worker slot runs next and counts its attempt,
// so that a stuck report reads both under mu, and has the stuck guard
// watch t if records wait behind it on a wide lane. Called with mu held.
func (e *engine) runs(slot int, t *task) {
	t.Value.attempts++
	e.running[slot] = slotRecord{t, e.awake.Stamp()}
	if t.Wide() && (t.Value.part.lanes.WideParked() > 0 || t.Value.run != nil) {
		e.armGuard() // the stuck guard watches: records wait behind this one
	}
}

// dispatched counts an attempt of t starting now and stamps it (see stamp).
func (e *engine) dispatched(t *task, now time.Time) {
	t.Value.attempts++
	e.stamp(t, now)
}

// stamp records when t's attempt, already counted, started, and tells the
// hooks.
func (e *engine) stamp(t *task, now time.Time) {
	it := &t.Value
	it.started = now.Sub(epoch)
	if it.attempts == 1 {
		it.first = it.started
	}
	for _, h := range e.hooks.dispatched {
		h.OnRecordDispatched(it.original(), it.attempts)
	}
}

// callHandler runs h on r, turning a panic into a *PanicError: a panic is
// a failed attempt, not a crash. It serves the engine and RunMembers alike.
func callHandler(ctx context.Context, h Handler, r *kgo.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h.Handle(ctx, r)
}

func (e *engine) callBatch(ctx context.Context, rs []*kgo.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return e.batch.HandleBatch(ctx, rs)
}

// observe runs the hooks and logs for a finished attempt, outside the lock,
// and returns the backoff before the next attempt when it failed.
func (e *engine) observe(t *task, err error) time.Duration {
	it := &t.Value
	if err == nil {
		e.recovered()
		if len(e.hooks.done) > 0 {
			lat := time.Since(epoch) - it.first
			for _, h := range e.hooks.done {
				h.OnRecordDone(it.original(), it.totalAttempts(), lat)
			}
		}
		return 0
	}
	backoff := e.cfg.backoff(it.attempts)
	if d, ok := retryAfter(err); ok {
		backoff = max(d, time.Millisecond)
	}
	r := it.original()
	attrs := []any{"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "attempt", it.attempts}
	switch {
	case IsPermanent(err):
		attrs = append(attrs, "next", "permanent: not retried")
	case it.attempts >= e.cfg.localAttempts(it) && !IsOverloaded(err):
		attrs = append(attrs, "next", "attempts used up")
	default:
		attrs = append(attrs, "retry_in", backoff)
	}
	attrs = append(attrs, "err", err)
	if pe, ok := err.(*PanicError); ok {
		attrs = append(attrs, "stack", string(pe.Stack))
	}
	if !e.overloaded(err, attrs) {
		e.log.Warn("kpar: handler failed", attrs...)
	}
	if e.cfg.nowhereToGo(it, err) {
		e.log.Error("kpar: record failed every attempt and there is no dead-letter sink; retrying it until it succeeds (set DeadLetters to move on)",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "class", classify(err, false), "err", err)
	}
	for _, h := range e.hooks.failed {
		h.OnAttemptFailed(r, it.totalAttempts(), err, backoff)
	}
	return backoff
}

// backoff is full jitter over an exponential capped at retryMax.
// It serves the engine and RunMembers alike.
func (c *cfg) backoff(attempt int) time.Duration {
	d := c.retryMax
	if attempt < 32 {
		d = min(c.retryBase<<(attempt-1), c.retryMax)
	}
	return time.Duration(rand.Int64N(int64(d)) + 1)
}

// finish records the outcome of one attempt and returns the record's lane
// successor, if it completed one (see complete). Called with mu held.
func (e *engine) finish(t *task, err error, timedOut bool, backoff time.Duration, now time.Time) (next *task) {
	ps := t.Value.part
	ps.running--
	e.limitDone(t, err, timedOut, now)
	switch {
	case ps.status == dropped:
	case err == nil:
		e.hangs.answer(t.Value.started)
		next = e.complete(t)
	case ps.status == revoking:
		// Not retried here: the record stays unfinished, so the revoke
		// commit stops below it and the next owner handles it.
	case ps.status == withdrawing && !e.keepTask(t):
		next = e.withdraw(t) // released for another member, not retried here
	default:
		if t.Wide() {
			// It retries on its key's lane: the partition's other keys
			// must not wait for it.
			e.split(ps, true)
		}
		e.fail(t, err, timedOut, backoff, now)
	}
	if ps.running == 0 && ps.idle != nil {
		close(ps.idle)
		ps.idle = nil
	}
	return next
}

// complete marks a record done: its window may move, its bytes are
// released, and its lane's next record, if any, is returned: the caller
// runs it or makes it ready. Called with mu held.
func (e *engine) complete(t *task) (next *task) {
	ps := t.Value.part
	if t.Value.run == nil {
		ps.win.Done(t.Value.seq)
		ps.progress++
		e.outcomes.Finished(t.Value.rec, t.Value.x != nil)
		e.pendOutputs(ps, t)
	} // a run's records were marked finished by markRun
	e.askCommit()
	next = ps.lanes.Release(t)
	if t.Value.run == nil {
		e.release(ps, t)
	} else {
		t.Value.rec, t.Value.run.recs = nil, nil
	}
	e.refill(ps)
	return next
}

// refill retires the tasks of ps's window below its start and moves held
// records into the room that frees, after a record of ps finished or was
// withdrawn; then it admits the records of any partition that wait for the
// bytes freed (admitOver). The finished task is not used past it: its chunk may be
// reused. Called with mu held.
func (e *engine) refill(ps *partState) {
	ps.tasks.retire(ps.win, &e.taskPool)
	if held := ps.held.Len(); held > 0 {
		// Refill a quarter window at a time: one wake-up, one pass; or
		// whatever room there is once the window's unfinished records are
		// fewer than that room, so that a window whose start is stuck
		// still fills (and its workers do not run dry).
		if room := e.cfg.windowRecords - ps.win.Len(); room > 0 && (room >= max(1, e.cfg.windowRecords/4) || room >= held || ps.win.Pending() <= room) {
			readyBefore := e.ready.Len()
			ps.held.take(min(room, held), func(recs []*kgo.Record, meta []recMeta) { e.enterRecords(ps, recs, meta) })
			e.enterWhileIdle(ps)
			e.wake(e.ready.Len() - readyBefore)
		}
	}
	if ps.buf.HeldFull() && ps.held.Len() <= ps.heldCap(e.cfg.windowRecords)/2 {
		ps.buf.SetHeldFull(false)
		e.syncPause(ps)
	}
	e.admitOver()
}

// release returns a finished record's budget. Called with mu held.
func (e *engine) release(ps *partState, t *task) {
	t.Value.rec = nil // the task's chunk outlives the record; let the record go
	e.releaseRecords(ps, t.Value.size, 1)
}

// releaseRecords returns the budget of n finished records of size bytes
// in all. Called with mu held.
func (e *engine) releaseRecords(ps *partState, size int64, n int) {
	if e.buf.Finish(&ps.buf, size, n, len(e.parts)) {
		e.syncPause(ps)
	}
	e.budgetFreed()
}

// wakePoller wakes the pollers that wait for buffered bytes to drop (see
// waitForBytes). Called with mu held.
func (e *engine) wakePoller() {
	if e.space != nil {
		close(e.space)
		e.space = nil
	}
}

// budgetFreed wakes the poller or the drain when they wait for it. Called
// with mu held.
func (e *engine) budgetFreed() {
	if !e.buf.Full() {
		e.wakePoller()
	}
	if e.buf.Drained() && e.drained != nil {
		close(e.drained)
		e.drained = nil
	}
}
