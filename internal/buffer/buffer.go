// Package buffer is the byte budget of kpar's pipeline: what buffered
// records weigh against MaxBufferedBytes, the records admitted and not
// finished that a drain waits for, and each partition's reasons to pause
// fetching.
//
// A record counts from its admission (Admit) to its end (Finish, or Drop
// of its partition). One waiting on a retry timer leaves the total
// (Park, until Unpark): however many records wait for retries, healthy
// partitions keep being fetched, and each partition's window still
// bounds its waiting records. When the budget is used up, a partition
// holding more than its fair share of it (the budget over the partitions)
// pauses (OverShare) until it is down to half its share: records stuck
// in one partition behind a retrying key must not hold the whole budget
// and stop the fetching of every other partition. A partition also pauses
// while a window's worth of records is held outside its full window
// (SetHeldFull). Sync turns the reasons into the pause the caller applies.
//
// Admission is bounded (Admits): a record is admitted only while the total
// is below the budget, so the total never exceeds it by more than one
// record, however large (one larger than the budget is admitted alone,
// once the total is below it). A partition takes more than its fair share
// only while the total is below half the budget: records stuck in one
// partition (its window start retrying) leave half of it to the others.
// A partition whose fetched records wait to be admitted pauses
// (SetOver) until they all are.
//
// Invariants: the total's bytes are the sum, over the partitions not
// dropped, of their bytes not parked; pending is the records admitted and
// neither finished nor dropped; a partition is paused exactly when it has
// a reason to be, once synced. Total and Part are pure: no goroutines, no
// lock (the caller holds its own), no I/O; the caller owns the channels
// that wake pollers and the drain.
package buffer

// Total is the pipeline's byte budget and its count of unfinished records.
type Total struct {
	max      int64 // MaxBufferedBytes
	bytes    int64 // recordSize of buffered records, but those parked
	pending  int   // admitted records not finished, over live partitions
	draining bool  // Drain was called: the pipeline stops
}

// Part is one partition's share of the budget and its reasons to pause.
type Part struct {
	bytes   int64 // recordSize of unfinished records, held ones included
	parked  int64 // the part of bytes parked on retry timers, outside the total
	paused  bool  // as last synced
	held    bool  // a window's worth of records is held outside the window
	overOwn bool  // over its fair share of a used-up budget
	over    bool  // fetched records wait outside the budget to be admitted
}

// New returns an empty budget of max bytes.
func New(max int64) Total { return Total{max: max} }

// Admit counts a record of size bytes admitted into p.
func (t *Total) Admit(p *Part, size int64) {
	p.bytes += size
	t.bytes += size
	t.pending++
}

// Admits reports whether p, one of parts partitions, may admit one more
// record now: the total is below the budget, and p is below its fair
// share or the total below half the budget. Parked bytes count for
// neither.
func (t *Total) Admits(p *Part, parts int) bool {
	return t.bytes < t.max && (p.bytes-p.parked < t.FairShare(parts) || t.bytes < t.max/2)
}

// Finish counts n records of size bytes in all as finished in p, one of
// parts partitions. It reports whether p's pause reasons changed (call
// Sync): p went down to half its share.
func (t *Total) Finish(p *Part, size int64, n, parts int) bool {
	p.bytes -= size
	t.bytes -= size
	t.pending -= n
	if p.overOwn && p.bytes-p.parked <= t.FairShare(parts)/2 {
		p.overOwn = false
		return true
	}
	return false
}

// Park moves size bytes of p waiting on a retry timer out of the total.
func (t *Total) Park(p *Part, size int64) {
	p.parked += size
	t.bytes -= size
}

// Unpark brings size parked bytes of p back into the total.
func (t *Total) Unpark(p *Part, size int64) {
	p.parked -= size
	t.bytes += size
}

// Drop forgets a dropped partition and its pending unfinished records
// (held ones included). It reports whether p was paused: the caller
// resumes it; its reasons are cleared.
func (t *Total) Drop(p *Part, pending int) (wasPaused bool) {
	t.bytes -= p.bytes - p.parked
	t.pending -= pending
	p.bytes = 0
	wasPaused = p.paused
	p.paused, p.held, p.overOwn, p.over = false, false, false, false
	return wasPaused
}

// Full reports whether the buffered bytes reached MaxBufferedBytes.
func (t *Total) Full() bool { return t.bytes >= t.max }

// FairShare is a partition's share of MaxBufferedBytes, of parts.
func (t *Total) FairShare(parts int) int64 { return t.max / int64(max(1, parts)) }

// OverShare notes whether p holds more than share bytes not parked: it
// reports true when that is a new reason to pause p (call Sync).
func (t *Total) OverShare(p *Part, share int64) bool {
	if !p.overOwn && p.bytes-p.parked > share {
		p.overOwn = true
		return true
	}
	return false
}

// Drain notes that the pipeline drains, and reports whether it is idle:
// no admitted record unfinished.
func (t *Total) Drain() (idle bool) {
	t.draining = true
	return t.pending == 0
}

// Drained reports whether a drain began and no record is unfinished.
func (t *Total) Drained() bool { return t.draining && t.pending == 0 }

// Pending is the admitted records not finished.
func (t *Total) Pending() int { return t.pending }

// Bytes is the buffered bytes, but those parked.
func (t *Total) Bytes() int64 { return t.bytes }

// SetHeldFull notes whether a window's worth of records is held outside
// p's window, and reports whether that changed (call Sync).
func (p *Part) SetHeldFull(full bool) bool {
	if p.held == full {
		return false
	}
	p.held = full
	return true
}

// SetOver notes whether fetched records of p wait to be admitted, and
// reports whether that changed (call Sync).
func (p *Part) SetOver(over bool) bool {
	if p.over == over {
		return false
	}
	p.over = over
	return true
}

// HeldFull reports whether p pauses for its held records.
func (p *Part) HeldFull() bool { return p.held }

// Paused reports whether p is paused, as last synced.
func (p *Part) Paused() bool { return p.paused }

// Bytes is p's unfinished records' size, parked ones included.
func (p *Part) Bytes() int64 { return p.bytes }

// Sync makes p paused exactly when it has a reason to be, and reports
// whether that changed, and to what: the caller pauses or resumes it.
func (p *Part) Sync() (changed, paused bool) {
	want := p.held || p.overOwn || p.over
	if want == p.paused {
		return false, p.paused
	}
	p.paused = want
	return true, want
}
