package kpar

import (
	"context"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// maxTake bounds how many ready records one worker takes per lock round
// trip. Taking several amortises the lock when handlers are fast; the share
// is ready/Concurrency, so slow handlers still spread one record per worker.
const maxTake = 64

// fastHandler is the per-record handler time below which a worker takes
// several records per lock round trip: there the lock, not the handler,
// dominates, and holding a few records back from other workers costs
// microseconds at most.
const fastHandler = 20 * time.Microsecond

// stealAfter is how long a worker may stay in one handler call before the
// records it took with it (and has not started) go back to the ready queue
// for other workers. Fast batches form only below fastHandler per record,
// so a call this long is an outlier: a slow record must not hold back the
// records taken with it.
const stealAfter = 10 * time.Millisecond

// stash holds the records a worker took and has not started yet. mu is
// taken after engine.mu when both are held; the stealer takes it alone.
type stash struct {
	mu    sync.Mutex
	tasks []*task // guarded by mu; tasks[head:] are waiting
	head  int     // guarded by mu

	// The record running now and its attempt number, written by the
	// worker: for stuck reports, and for the stealer, which sees a worker
	// that made no progress when current stayed the same for stealAfter.
	current        atomic.Pointer[task]
	currentAttempt atomic.Int32
	seen           *task // current at the stealer's last look; owned by the stealer

	_ [falseSharingPad]byte // every worker writes its stash: keep them off each other's lines
}

// pop removes the next waiting task, or returns nil. The slice keeps its
// array, so a worker's stash allocates once, not once per take.
func (s *stash) pop() *task {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head == len(s.tasks) {
		return nil
	}
	t := s.tasks[s.head]
	s.tasks[s.head] = nil
	if s.head++; s.head == len(s.tasks) {
		s.tasks, s.head = s.tasks[:0], 0
	}
	return t
}

// push appends tasks to the waiting ones.
func (s *stash) push(tasks []*task) {
	s.mu.Lock()
	s.tasks = append(s.tasks, tasks...)
	s.mu.Unlock()
}

// takeAll removes and returns every waiting task, for the stealer.
func (s *stash) takeAll() []*task {
	s.mu.Lock()
	defer s.mu.Unlock()
	stolen := slices.Clone(s.tasks[s.head:])
	clear(s.tasks)
	s.tasks, s.head = s.tasks[:0], 0
	return stolen
}

func (s *stash) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tasks) - s.head
}

// stealer gives the stashed records of a worker that has been in one
// handler call for stealAfter back to the ready queue, so that other
// workers run them. It runs until ctx ends.
func (e *engine) stealer(ctx context.Context) {
	t := time.NewTicker(stealAfter)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i := range e.stashes {
			st := &e.stashes[i]
			if cur := st.current.Load(); cur == nil || cur != st.seen {
				st.seen = cur // idle between calls, or a new record since
				continue
			}
			stolen := st.takeAll()
			if len(stolen) == 0 {
				continue
			}
			e.mu.Lock()
			ready := 0
			for _, t := range stolen {
				ps := t.Value.part
				ps.running--
				e.active--
				if ps.running == 0 && ps.idle != nil {
					close(ps.idle)
					ps.idle = nil
				}
				if ps.status == live {
					e.ready.Push(t)
					ready++
				}
			}
			e.wake(ready)
			e.mu.Unlock()
		}
	}
}

func (e *engine) worker(ctx context.Context, slot int) {
	var (
		batch []*task
		recs  []*kgo.Record
		st    = &e.stashes[slot]
		// perRecord estimates this worker's handler time per record. Until
		// a fast handler is measured, records are taken one at a time so a
		// slow handler never sits on records another worker could run.
		perRecord = time.Hour
	)
	e.mu.Lock()
	for {
		for (e.ready.Len() == 0 || e.limited()) && !e.stop {
			e.idle++
			e.cond.Wait()
			e.idle--
		}
		if e.stop {
			e.mu.Unlock()
			return
		}
		batch = e.take(batch[:0], perRecord)
		if e.ready.Len() > 0 && e.idle > 0 {
			e.cond.Signal() // pass the wake-up on: there is more to do
		}
		if len(batch) == 0 {
			continue
		}
		if e.batch == nil {
			st.push(batch)
			clear(batch)
		}
		e.mu.Unlock()

		// Both return with mu held, so the last finish and the next take
		// share one lock round trip.
		if e.batch != nil {
			e.runBatch(ctx, slot, batch, &recs)
		} else {
			perRecord = e.runEach(ctx, slot, perRecord)
		}
	}
}

// runEach runs the handler on each record of the worker's stash and
// finishes each one as soon as its handler returns, so a slow record never
// holds back the completion of a fast one taken with it; the stealer gives
// the rest of the stash to other workers when one call runs long. It
// returns with mu held and the updated estimate of the handler's time per
// record.
func (e *engine) runEach(ctx context.Context, slot int, perRecord time.Duration) time.Duration {
	st := &e.stashes[slot]
	start := time.Now()
	// A batch only forms when the handler is fast; its records then share
	// one attempt context and one clock reading, which would otherwise cost
	// more than the handler. If the shared context is cancelled (the batch
	// ran past AttemptTimeout), the rest get contexts of their own.
	fast := perRecord < fastHandler
	var shared *attemptCtx
	now := start
	ran := 0
	locked := false
	var carry *task // a lane's successor, run next by this worker
	for {
		t := carry
		carry = nil
		if t == nil {
			t = st.pop()
		}
		if t == nil {
			break
		}
		if locked {
			e.mu.Unlock()
			locked = false
		}
		if shared == nil && ran > 0 {
			now = time.Now()
		}
		ran++
		e.dispatched(t, now)
		st.current.Store(t)
		st.currentAttempt.Store(int32(t.Value.attempts))
		actx := shared
		if actx == nil {
			actx = &attemptCtx{Context: ctx, deadline: now.Add(e.cfg.attemptTimeout), task: t, attempt: t.Value.attempts}
			e.slots[slot].Store(actx)
			if fast {
				shared = actx
			}
		}
		err := callHandler(actx, e.handler, t.Value.original())
		timedOut := err != nil && actx.timedOut()
		if actx != shared || actx.Err() != nil {
			e.slots[slot].Store(nil)
			shared = nil
		}
		backoff := e.observe(t, err)
		e.mu.Lock()
		locked = true
		next := e.finish(t, err, timedOut, backoff, now)
		if next != nil {
			if fast && ran < maxTake && next.Value.part.status == live && e.rate == nil {
				// Run the key's (or partition's) next record here:
				// no queueing, no wake-up, no hand-off between workers.
				next.Value.part.running++
				e.active++
				carry = next
			} else {
				e.ready.Push(next)
				if st.len() > 0 {
					e.wake(1)
				} // else this worker takes again at once
			}
		}
	}
	st.current.Store(nil)
	if !locked {
		e.mu.Lock()
	}
	if shared != nil {
		e.slots[slot].Store(nil)
	}
	if ran == 0 {
		return perRecord // everything was stolen before it started
	}
	took := time.Since(start) / time.Duration(ran)
	if perRecord > time.Minute {
		return took
	}
	return (perRecord*3 + took) / 4
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
	actx := &attemptCtx{Context: ctx, deadline: start.Add(e.cfg.attemptTimeout), task: batch[0], attempt: batch[0].Value.attempts}
	e.slots[slot].Store(actx)
	err := e.callBatch(actx, *recs)
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
		e.active -= len(batch) - 1
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

// take pops the records this worker runs next and marks them running.
// Workers whose handler is fast take a share of the ready queue at once, so
// the lock is paid once per several records; others take one. Called with
// mu held.
func (e *engine) take(batch []*task, perRecord time.Duration) []*task {
	n := 1
	if e.batch == nil && perRecord < fastHandler {
		n = min(maxTake, (e.ready.Len()+e.cfg.concurrency-1)/e.cfg.concurrency)
	}
	for len(batch) < n && !e.limited() {
		t := e.ready.Pop()
		if t == nil {
			break
		}
		ps := t.Value.part
		if ps.status != live {
			continue // revoked: its new owner handles it
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
		before := len(batch)
		batch = append(batch, t)
		if e.batch != nil {
			batch = e.fillBatch(batch, t)
		}
		e.active += len(batch) - before
		e.started(len(batch) - before)
	}
	return batch
}

// limited reports whether the adaptive limit lets no attempt start now,
// arming a wake-up when it pauses dispatching. Called with mu held.
func (e *engine) limited() bool {
	if e.throttled() {
		return true
	}
	if e.lim == nil {
		return false
	}
	ok, wait := e.lim.Allow(time.Now(), e.active)
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

func (e *engine) dispatched(t *task, now time.Time) {
	it := &t.Value
	it.attempts++
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
	e.active--
	if e.lim != nil {
		end := time.Now()
		e.lim.Done(end, end.Sub(epoch)-t.Value.started, timedOut || IsOverloaded(err))
		e.wake(1) // the limit may have room again
	}
	e.breakerDone(t, err, timedOut, now)
	switch {
	case ps.status == dropped:
	case err == nil:
		next = e.complete(t)
	case ps.status == revoking:
		// Not retried here: the record stays unfinished, so the revoke
		// commit stops below it and the next owner handles it.
	default:
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
	ps.win.Done(t.Value.seq)
	ps.progress++
	e.askCommit()
	next = ps.lanes.Release(t)
	e.release(ps, t)
	if held := ps.held.Len(); held > 0 {
		// Refill in chunks of a quarter window so slabs stay large.
		if room := e.cfg.windowRecords - ps.win.Len(); room >= max(1, e.cfg.windowRecords/4) || room >= held {
			readyBefore := e.ready.Len()
			ps.held.take(min(room, held), func(t *task) { e.enter(ps, t) })
			e.wake(e.ready.Len() - readyBefore)
		}
	}
	if ps.heldFull && ps.held.Len() <= ps.heldCap(e.cfg.windowRecords)/2 {
		ps.heldFull = false
		e.syncPause(ps)
	}
	return next
}

// release returns a finished record's budget. Called with mu held.
func (e *engine) release(ps *partState, t *task) {
	ps.bytes -= t.Value.size
	e.bytes -= t.Value.size
	e.pending--
	t.Value.rec = nil // the slab may outlive the record; let the record go
	if ps.overBudget && ps.bytes-ps.waiting <= e.budgetShare()/2 {
		ps.overBudget = false
		e.syncPause(ps)
	}
	e.budgetFreed()
}

// wakePoller wakes the poller if it waits for buffered bytes to drop (see
// waitForBytes). Called with mu held.
func (e *engine) wakePoller() {
	if e.pollWait {
		e.pollWait = false
		select {
		case e.space <- struct{}{}:
		default:
		}
	}
}

// budgetFreed wakes the poller or the drain when they wait for it. Called
// with mu held.
func (e *engine) budgetFreed() {
	if e.bytes < e.cfg.maxBytes {
		e.wakePoller()
	}
	if e.draining && e.pending == 0 && e.drained != nil {
		close(e.drained)
		e.drained = nil
	}
}
