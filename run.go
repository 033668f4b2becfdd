package kpar

import (
	"context"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/kpar/kpar/internal/window"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Record runs. While the handler is tiny, the records of a partition that
// enter its window together, on its one lane (partition mode) or its wide
// lane (key and unordered modes, widelane.go), enter as runs: up to
// runRecords consecutive records under one task. A run is scheduled,
// taken, finished and released once, and its records get no task, no
// lane admission and no wake-up of their own: the worker that takes it
// runs them one after another, as it would have run the lane's successors
// (runEach), and marks them finished in the window together. In kpar
// bench noop that per-record bookkeeping, not the hand-off between
// goroutines, was what kept kpar below the raw loop (BENCHMARKS.md,
// eleventh pass).
//
// A run stays a run only while nothing needs its records one by one:
//   - a record of the run fails: it becomes a task of its own, which takes
//     the run's turn on the lane and fails as any record does (retry,
//     retry topic, dead letter), and the records after it get tasks too and
//     wait right behind it, in order;
//   - the partition splits its wide lane (a failure, or the stuck guard):
//     every run of the lane gives back the records it has not started,
//     as tasks that split like any other (giveBack);
//   - the stuck guard sees a run's record run for two ticks: the records
//     the worker ran before it are marked finished at once, so the window
//     start, the commits and the stuck report name the record that is
//     running;
//   - the partition is revoked or dropped: the run's worker runs no more
//     of its records (stopRuns); their next owner does.
//
// The worker claims each record before running it, and the engine takes
// records back only from the end that no worker claimed, with one atomic
// word between them (recRun.state): no record runs twice, and none is
// taken back once it started.

// runRecords is the most records a run holds: a worker's run of cheap
// records between two lock round trips, as maxTake is.
const runRecords = 64

// recRun is the records of one run and how far its worker got.
type recRun struct {
	recs []*kgo.Record
	meta []recMeta // index for index with recs
	// state is claimed<<32 | end: the worker has claimed (started) the
	// records below claimed and may claim those below end. The worker
	// raises claimed, the engine (under mu) lowers end.
	state atomic.Uint64
	// marked counts the records, from the first, marked finished in the
	// window. Guarded by engine.mu.
	marked int
}

// runTask is a run and the task it is scheduled as, in one allocation.
type runTask struct {
	t   task
	run recRun
}

func packRun(claimed, end int) uint64 { return uint64(claimed)<<32 | uint64(uint32(end)) }

func unpackRun(s uint64) (claimed, end int) { return int(s >> 32), int(uint32(s)) }

// claim claims the next record for the worker running the run, and
// reports false when the run has none left.
func (r *recRun) claim() (int, bool) {
	for {
		s := r.state.Load()
		c, end := unpackRun(s)
		if c >= end {
			return 0, false
		}
		if r.state.CompareAndSwap(s, packRun(c+1, end)) {
			return c, true
		}
	}
}

// cut lowers the run's end to the records claimed, but never below keep,
// and returns the new end and the old: the records in between are the
// caller's now.
func (r *recRun) cut(keep int) (end, old int) {
	for {
		s := r.state.Load()
		c, e := unpackRun(s)
		end = min(e, max(c, keep))
		if end == e || r.state.CompareAndSwap(s, packRun(c, end)) {
			return end, e
		}
	}
}

// claimed returns the number of records the worker has started.
func (r *recRun) claimed() int { c, _ := unpackRun(r.state.Load()); return c }

// left returns the number of records no worker has started and the run
// still holds.
func (r *recRun) left() int { c, e := unpackRun(r.state.Load()); return max(e-c, 0) }

// runsOK reports whether records entering ps's window now may enter as
// runs. It may open ps's wide lane. Called with mu held.
func (e *engine) runsOK(ps *partState) bool {
	if !e.cost.RunsOK() || ps.level > 0 || ps.skip != nil {
		return false
	}
	if e.cfg.ordering == ByPartition {
		return true
	}
	// wideHold == 0: openWide would count a held-off record otherwise,
	// and enter counts it again.
	return e.cost.WideOK() && (ps.wide || (ps.wideHold == 0 && ps.openWide(e.cost.TinyOrUnmeasured())))
}

// enterRecords enters prepared records into ps's window: as runs where
// runsOK, else one by one (enter). Called with mu held.
func (e *engine) enterRecords(ps *partState, recs []*kgo.Record, meta []recMeta) {
	for len(recs) > 0 {
		n := 1
		if len(recs) > 1 && e.runsOK(ps) {
			n = min(len(recs), runRecords)
			e.enterRun(ps, recs[:n], meta[:n])
		} else {
			e.enter(ps, recs[0], &meta[0])
		}
		recs, meta = recs[n:], meta[n:]
	}
}

// enterRun appends recs to ps's window as one run and schedules it on the
// lane. Called with mu held.
func (e *engine) enterRun(ps *partState, recs []*kgo.Record, meta []recMeta) {
	e.runsEntered++
	rt := new(runTask)
	seq := ps.win.Push(meta[0].offset)
	size := meta[0].size
	for i := 1; i < len(meta); i++ {
		ps.win.Push(meta[i].offset)
		size += meta[i].size
	}
	rt.run.recs, rt.run.meta = recs, meta
	rt.run.state.Store(packRun(0, len(recs)))
	t := &rt.t
	t.Value.rec, t.Value.part, t.Value.seq, t.Value.size = recs[0], ps, seq, size
	t.Value.run = &rt.run
	if ps.lanes.AdmitWide(t) {
		e.ready.Push(t)
	} else if e.cfg.ordering != ByPartition {
		e.armGuard() // the stuck guard watches: parked behind the lane's running record
	}
}

// runRun runs the handler on the records of run task t, first to last,
// and returns how many succeeded before the first failure and the failure
// (with whether its attempt timed out). It leaves the records after a
// failed one in the run: finishRun takes them back under mu, so a split
// in between (the stuck guard's) takes them back instead, and they are
// never out of both the run and the lanes. at is when the run started;
// shared and fast are runEach's. Called without mu.
func (e *engine) runRun(ctx context.Context, slot int, t *task, at time.Time, shared **attemptCtx, fast bool) (done int, err error, timedOut bool) {
	run := t.Value.run
	dispatchHooks, doneHooks := len(e.hooks.dispatched) > 0, len(e.hooks.done) > 0
	e.stamp(t, at)
	for {
		i, ok := run.claim()
		if !ok {
			return done, nil, false
		}
		r := run.recs[i]
		started := at
		if i > 0 && (*shared == nil || doneHooks) {
			started = time.Now()
		}
		if i > 0 && dispatchHooks {
			for _, h := range e.hooks.dispatched {
				h.OnRecordDispatched(r, 1)
			}
		}
		// t.Value.attempts is 1: a run is taken once (runs).
		if err, timedOut = e.attempt(ctx, slot, t, r, started, shared, fast); err != nil {
			return done, err, timedOut
		}
		e.recovered()
		if doneHooks {
			lat := time.Since(started)
			for _, h := range e.hooks.done {
				h.OnRecordDone(r, 1, lat)
			}
		}
		done++
	}
}

// failedInRun returns, for observe, a task for record i of run task t,
// which failed: not in any store, lane or queue. Called without mu by the
// run's worker, so it copies only what the worker owns or nobody changes:
// the engine rewrites t's lane when it splits the wide lane (giveBack).
func failedInRun(t *task, i int) *task {
	f := &task{}
	f.Value.rec, f.Value.part, f.Value.seq = t.Value.run.recs[i], t.Value.part, t.Value.seq+window.Seq(i)
	f.Value.size, f.Value.attempts = t.Value.run.meta[i].size, 1
	f.Value.first, f.Value.started = t.Value.first, t.Value.started
	return f
}

// finishRun records the outcome of run task t: done records succeeded
// and, when err is not nil, the next one failed. It returns the lane's
// next task, as finish does. Called with mu held.
func (e *engine) finishRun(t *task, done int, err error, timedOut bool, backoff time.Duration, now time.Time) *task {
	ps := t.Value.part
	if ps.status == dropped {
		return e.finish(t, err, timedOut, backoff, now)
	}
	e.markRun(t, done)
	if err == nil {
		return e.finish(t, nil, false, 0, now)
	}
	// The failed record becomes a task of its own, in the run's place on
	// its lane, with the records after it that the run still holds right
	// behind (none if a split took them back while the record ran).
	_, end := t.Value.run.cut(done + 1)
	failed := ps.recordTask(t, done, &e.taskPool)
	failed.Value.attempts = 1
	failed.Value.first, failed.Value.started = t.Value.first, t.Value.started
	var behind []*task
	for i := done + 1; i < end; i++ {
		behind = append(behind, ps.recordTask(t, i, &e.taskPool))
	}
	ps.lanes.Replace(t, failed, behind)
	t.Value.rec, t.Value.run.recs = nil, nil
	return e.finish(failed, err, timedOut, backoff, now)
}

// markRun marks the records of run task t below upTo finished in the
// window, those not marked before, and releases their budget. Called with
// mu held.
func (e *engine) markRun(t *task, upTo int) {
	ps, run := t.Value.part, t.Value.run
	if upTo <= run.marked {
		return
	}
	var size int64
	for i := run.marked; i < upTo; i++ {
		ps.win.Done(t.Value.seq + window.Seq(i))
		size += run.meta[i].size
	}
	n := upTo - run.marked
	e.outcomes.FinishedRun(run.recs[run.marked:upTo])
	run.marked = upTo
	ps.progress += uint64(n)
	e.releaseRecords(ps, size, n)
	e.askCommit()
}

// recordTask gives record i of ps's run task t a task of its own, at its
// seq in ps's task store, from pool. Called with mu held.
func (ps *partState) recordTask(t *task, i int, pool *taskPool) *task {
	run := t.Value.run
	seq := t.Value.seq + window.Seq(i)
	rt := ps.tasks.at(seq, pool)
	initTask(rt, ps, run.recs[i], seq, run.meta[i].size, run.meta[i].lane)
	return rt
}

// giveBack takes back from run task t the records no worker started, all
// but the first when none did, and returns them as tasks of their own,
// in order; nothing for a task that is not a run. t keeps the lane of its
// last record's key, for Split. Called with mu held.
func (e *engine) giveBack(t *task) []*task {
	run := t.Value.run
	if run == nil {
		return nil
	}
	end, old := run.cut(1)
	var back []*task
	for i := end; i < old; i++ {
		back = append(back, t.Value.part.recordTask(t, i, &e.taskPool))
	}
	if e.cfg.ordering == ByKey {
		last := run.recs[end-1]
		t.Value.lane = 0
		if lane := run.meta[end-1].lane; lane == unhashed {
			t.Value.lane = max(maphash.Bytes(e.seed, last.Key), unhashed+1)
		} else if lane != 0 {
			t.Value.lane = lane
		}
	}
	return back
}

// stopRuns has the runs of ps that workers run now start no more of their
// records: ps is revoked or dropped, and its next owner handles them.
// Called with mu held.
func (e *engine) stopRuns(ps *partState) {
	for _, r := range e.running {
		if r.t != nil && r.t.Value.part == ps && r.t.Value.run != nil {
			r.t.Value.run.cut(1)
		}
	}
}

// current returns the record a run task's worker runs now, or the task's
// record when it is not a run. Called with mu held, for reports.
func (it *item) current() *kgo.Record {
	if it.run == nil || it.run.recs == nil {
		return it.rec
	}
	return it.run.recs[max(it.run.claimed(), 1)-1]
}
