package kpar

import (
	"context"
	"hash/maphash"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Admission: how delivered records enter the pipeline, whatever their
// source. A record is prepared outside the lock (prepare), accepted into
// its partition's window (acceptWithin, enter), or held outside a full window
// (held.go) until room frees; what buffered records weigh is bounded by
// MaxBufferedBytes (acceptWithin, admitOver, waitForBytes,
// pauseOverShare), and pausing a
// partition's fetching is decided here and applied by the fetch controller
// through the source.

// waitForBytes waits until buffered bytes are below MaxBufferedBytes: a
// poll while they are not could admit none of its records. It pauses the
// partitions holding more than their share of the budget first, so the
// fetches that follow bring the others' records. It reports false when ctx
// ended first. Every poller of a source calls it (a range has one per
// slice): the wake-up is a broadcast.
func (e *engine) waitForBytes(ctx context.Context) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		// Bytes freed by a park or a dropped partition are given to the
		// records waiting for them first.
		e.admitOver()
		if !e.buf.Full() {
			return true
		}
		e.pauseOverShare()
		if e.space == nil {
			e.space = make(chan struct{})
		}
		space := e.space
		e.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			e.mu.Lock()
			return false
		}
		e.mu.Lock()
	}
}

// recordOverhead approximates the memory a buffered record costs beyond its
// bytes: the kgo.Record and kpar's task.
const recordOverhead = 256

// recordSize is what a buffered record counts against MaxBufferedBytes.
func recordSize(r *kgo.Record) int64 {
	n := recordOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// acceptWithin puts one partition's prepared records (recs, with meta
// from prepare) into its window and the scheduler within MaxBufferedBytes:
// records are admitted while the budget admits them (buffer.Total.Admits:
// below the bound, so it is exceeded by one record at most, and a record
// larger than it is admitted alone), and those it has no room for wait in
// ps.over, not counted and handed to nobody, the partition paused (a share
// group's poller instead waits for them), until bytes free (admitOver). A
// fetch can be several times the bound (a broker returns a partition's
// first batch whatever its size, and a poll takes every buffered fetch),
// so admitting whole polls did not bound anything. fetched is the size of
// the fetch they came in, the unit of heldCap. Called with mu held.
func (e *engine) acceptWithin(ps *partState, recs []*kgo.Record, meta []recMeta, fetched int) {
	if ps.status == withdrawing {
		// A share poll that ended as the member stopped: its records are
		// withdrawn at their turn (withdraw.go), their budget with them.
		for i := range meta {
			e.buf.Admit(&ps.buf, meta[i].size)
		}
		e.place(ps, recs, meta, fetched)
		return
	}
	if ps.over.Len() > 0 {
		ps.over.push(recs, meta) // fetched before its pause took effect: after those waiting
		return
	}
	n, parts := 0, len(e.parts)
	for n < len(meta) && e.buf.Admits(&ps.buf, parts) {
		e.buf.Admit(&ps.buf, meta[n].size)
		n++
	}
	if n > 0 {
		e.place(ps, recs[:n], meta[:n], fetched)
	}
	if n < len(meta) {
		ps.over.push(recs[n:], meta[n:])
		ps.fetched = fetched
		e.overParts = append(e.overParts, ps)
		if ps.buf.SetOver(true) {
			e.syncPause(ps)
		}
	}
}

// admitOver admits the records waiting in the partitions' over queues as
// far as the budget admits them: the partitions in turn, one that was
// served going to the back of the line, so that none waits for the others
// forever. It is called where held records enter windows too (refill,
// after a record finished), and by the pollers before they wait, never
// while a lane is being changed. Called with mu held.
func (e *engine) admitOver() {
	if len(e.overParts) == 0 || e.buf.Full() {
		return
	}
	line, parts := e.overParts, len(e.parts)
	next := make([]*partState, 0, len(line))
	var served []*partState
	i := 0
	for ; i < len(line) && !e.buf.Full(); i++ {
		ps := line[i]
		if ps.status != live {
			ps.over.reset() // its owner fetches them again; Drop clears the pause
			continue
		}
		n := ps.over.count(func(m *recMeta) bool {
			if !e.buf.Admits(&ps.buf, parts) {
				return false
			}
			e.buf.Admit(&ps.buf, m.size)
			return true
		})
		ps.over.take(n, func(recs []*kgo.Record, meta []recMeta) { e.place(ps, recs, meta, ps.fetched) })
		switch {
		case ps.over.Len() == 0:
			if ps.buf.SetOver(false) {
				e.syncPause(ps)
			}
		case n > 0:
			served = append(served, ps)
		default:
			next = append(next, ps)
		}
	}
	e.overParts = append(append(next, line[i:]...), served...)
}

// place puts admitted records into ps's window, or, those that do not fit
// in a full window, holds them until it has room; once heldCap are held
// the partition is paused: its source stops fetching it while the others
// go on. Called with mu held.
func (e *engine) place(ps *partState, recs []*kgo.Record, meta []recMeta, fetched int) {
	readyBefore := e.ready.Len()
	if ps.held.Len() == 0 {
		room := min(len(meta), e.cfg.windowRecords-ps.win.Len())
		e.enterRecords(ps, recs[:room], meta[:room])
		recs, meta = recs[room:], meta[room:]
	}
	ps.held.push(recs, meta)
	e.enterWhileIdle(ps)
	ps.fetched = fetched
	// Keep records fetched ahead, so a draining window refills without
	// waiting for a fetch; pause beyond heldCap.
	if ps.held.Len() >= ps.heldCap(e.cfg.windowRecords) && ps.buf.SetHeldFull(true) {
		e.syncPause(ps)
	}
	e.wake(e.ready.Len() - readyBefore)
}

// recMeta is what prepare computes for a polled record, outside the lock.
// It holds no pointer, so held records cost the GC no scanning.
type recMeta struct {
	offset int64 // the record's offset: entering the window must not touch a cold record
	size   int64 // recordSize
	lane   uint64
}

// prepare computes, before the lock is taken, the offsets, sizes and, in
// key mode, the keys' hashes of one partition's polled records, so that
// entering the window (at once or later, from held) is bookkeeping only.
func (e *engine) prepare(recs []*kgo.Record) []recMeta {
	meta := make([]recMeta, len(recs))
	// Keys are hashed for the lanes of ByKey and for KeyRateLimit. Where
	// key mode may use wide lanes, a key is hashed only once its record
	// needs a key lane (laneOf): a cheap handler's records rarely do, and
	// reading every key costs a cache miss per record.
	keyed := e.cfg.ordering == ByKey || e.limits.Keyed()
	lazy := e.cost.WideOK() && e.cfg.ordering == ByKey
	for i, r := range recs {
		m := &meta[i]
		m.offset, m.size = r.Offset, recordSize(r)
		switch {
		case !keyed || r.Key == nil:
		case lazy:
			m.lane = unhashed
		default:
			m.lane = max(maphash.Bytes(e.seed, r.Key), unhashed+1)
		}
	}
	return meta
}

// enter appends a prepared record to ps's window, gives it its task and
// schedules it. Called with mu held.
func (e *engine) enter(ps *partState, rec *kgo.Record, m *recMeta) {
	if ps.skip != nil && ps.finishedBefore(m.offset) {
		// Finished before the last commit (its metadata said so): take
		// its place in the window, done, without running it.
		ps.win.Done(ps.win.Push(m.offset))
		ps.progress++
		ps.skipped++
		if ps.kept != nil {
			e.keptOutputsAt(ps, m.offset)
		}
		e.releaseRecords(ps, m.size, 1)
		ps.tasks.retire(ps.win, &e.taskPool)
		return
	}
	seq := ps.win.Push(m.offset)
	t := ps.tasks.at(seq, &e.taskPool)
	initTask(t, ps, rec, seq, m.size, m.lane)
	if ps.level > 0 {
		// A record with bad headers is handled as it is; the group
		// source logged it (checkRetryHeaders), outside the lock.
		_ = decodeRetry(&t.Value, ps.level)
	}
	e.schedule(t)
}

// pauseOverShare pauses the partitions that hold more than their share of
// a used-up MaxBufferedBytes: the fetches after the budget frees bring the
// other partitions' records, not more of those holding it (records stuck
// behind a retrying key, say). Called with mu held.
func (e *engine) pauseOverShare() {
	share := e.buf.FairShare(len(e.parts))
	for _, ps := range e.parts {
		if ps.status == live && e.buf.OverShare(&ps.buf, share) {
			e.syncPause(ps)
		}
	}
}

// syncPause pauses or resumes fetching ps when its reasons to pause
// changed. Called with mu held.
func (e *engine) syncPause(ps *partState) {
	if changed, paused := ps.buf.Sync(); changed {
		e.toggleFetch(fetchToggle{ps, paused, ps.win.Len(), true})
		if !paused {
			e.wakePoller() // it may wait for bytes with every partition paused
		}
	}
}

// fetchToggle is a decision, taken under mu, to pause or resume fetching a
// partition; the fetch controller applies it to the client and tells the
// hooks, outside the lock.
type fetchToggle struct {
	ps       *partState
	pause    bool
	buffered int  // the window's size when it was decided, for the hooks
	report   bool // call the paused/resumed hooks (not for a dropped partition)
}

// toggleFetch queues t for the fetch controller. Called with mu held.
func (e *engine) toggleFetch(t fetchToggle) {
	e.toggles = append(e.toggles, t)
	select {
	case e.toggleWake <- struct{}{}:
	default:
	}
}

// fetchController applies pause and resume decisions in the order they
// were taken, through the source, so that neither a client nor a user hook
// is ever called under the pipeline's lock. It runs until ctx ends.
func (e *engine) fetchController(ctx context.Context) {
	var todo []fetchToggle
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.toggleWake:
		}
		e.mu.Lock()
		todo, e.toggles = e.toggles, todo[:0]
		e.mu.Unlock()
		for _, t := range todo {
			e.src.pause(t.ps, t.pause)
			if !t.report {
				continue
			}
			if t.pause {
				for _, h := range e.hooks.paused {
					h.OnPartitionPaused(t.ps.topic, t.ps.partition, t.buffered)
				}
			} else {
				for _, h := range e.hooks.resumed {
					h.OnPartitionResumed(t.ps.topic, t.ps.partition, t.buffered)
				}
			}
		}
		clear(todo)
	}
}
