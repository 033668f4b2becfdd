package kpar

import (
	"context"
	"hash/maphash"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Admission: how delivered records enter the pipeline, whatever their
// source. A record is prepared outside the lock (prepare), accepted into
// its partition's window (accept, enter), or held outside a full window
// (held.go) until room frees; what buffered records weigh is bounded by
// MaxBufferedBytes (waitForBytes, pauseOverShare), and pausing a
// partition's fetching is decided here and applied by the fetch controller
// through the source.

// waitForBytes waits until buffered bytes are below MaxBufferedBytes, or
// until the partitions holding more than their share of them are paused
// and others can still be fetched. It reports false when ctx ended first.
// Every poller of a source calls it (a range has one per slice): the
// wake-up is a broadcast.
func (e *engine) waitForBytes(ctx context.Context) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.buf.Full() {
		if e.pauseOverShare() {
			return true
		}
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
	return true
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

// accept puts one partition's prepared records (recs, with meta from
// prepare) into its window and the scheduler: every source delivers
// through it. Records that do not fit in a full window are held until it
// has room; once heldCap are held the partition is paused: its source
// stops fetching it while the others go on. fetched is the size of the
// fetch they came in, the unit of heldCap. Called with mu held.
func (e *engine) accept(ps *partState, recs []*kgo.Record, meta []recMeta, fetched int) {
	for i := range meta {
		e.buf.Admit(&ps.buf, meta[i].size)
	}
	readyBefore := e.ready.Len()
	if ps.held.Len() == 0 {
		room := min(len(meta), e.cfg.windowRecords-ps.win.Len())
		e.enterRecords(ps, recs[:room], meta[:room])
		recs, meta = recs[room:], meta[room:]
	}
	ps.held.push(recs, meta)
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
	keyed := e.cfg.ordering == ByKey || (e.rate != nil && e.rate.keys != nil)
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
// a used-up MaxBufferedBytes, and reports whether some live partition can
// still be fetched. Without it, records stuck in one partition (behind a
// retrying key, say) would hold all of MaxBufferedBytes and stop the poller, and
// with it every other partition. Called with mu held.
func (e *engine) pauseOverShare() bool {
	share, fetchable := e.buf.FairShare(len(e.parts)), false
	for _, ps := range e.parts {
		if ps.status != live {
			continue
		}
		if e.buf.OverShare(&ps.buf, share) {
			e.syncPause(ps)
		}
		fetchable = fetchable || !ps.buf.Paused()
	}
	return fetchable
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
