package kpar

import "github.com/twmb/franz-go/pkg/kgo"

// heldQueue holds, in offset order, the fetched records of a partition that
// did not fit in its window (see partState.held). It keeps the record
// slices of the fetches and what prepare computed for them, not a task per
// record: holding a fetch's records costs one append, and a held record
// gets its task (taskStore) only when it enters the window.
type heldQueue struct {
	segs []heldSeg // segs[0].recs[0] is the next record to enter
	n    int
}

// heldSeg is part of one fetch of the partition: its records and their
// prepared bookkeeping, index for index.
type heldSeg struct {
	recs []*kgo.Record
	meta []recMeta
}

// Len returns the number of held records.
func (q *heldQueue) Len() int { return q.n }

// push holds recs, whose offsets follow those already held, with their
// meta (same length).
func (q *heldQueue) push(recs []*kgo.Record, meta []recMeta) {
	if len(recs) == 0 {
		return
	}
	q.segs = append(q.segs, heldSeg{recs, meta})
	q.n += len(recs)
}

// lastOffset returns the offset of the last held record; q must not be
// empty.
func (q *heldQueue) lastOffset() int64 {
	s := q.segs[len(q.segs)-1]
	return s.meta[len(s.meta)-1].offset
}

// take removes the first n held records (n at most Len), calling fn on
// them in order, a fetch's part at a time.
func (q *heldQueue) take(n int, fn func([]*kgo.Record, []recMeta)) {
	q.n -= n
	for n > 0 {
		s := q.segs[0]
		k := min(n, len(s.recs))
		fn(s.recs[:k], s.meta[:k])
		n -= k
		if k < len(s.recs) {
			q.segs[0] = heldSeg{s.recs[k:], s.meta[k:]}
			continue
		}
		q.segs[0] = heldSeg{}
		q.segs = q.segs[1:]
	}
	if q.n == 0 {
		q.segs = nil
	}
}

// count returns how many held records, from the first, ok accepts: it is
// called on each in order until it refuses one.
func (q *heldQueue) count(ok func(*recMeta) bool) int {
	n := 0
	for _, s := range q.segs {
		for i := range s.meta {
			if !ok(&s.meta[i]) {
				return n
			}
			n++
		}
	}
	return n
}

// reset forgets every held record.
func (q *heldQueue) reset() { *q = heldQueue{} }

// enterWhileIdle moves held records into ps's window for as long as the
// window holds nothing unfinished. Records the commit metadata (or work
// kept from a lost assignment: partState.skip) says were finished enter
// the window done, without running; when every record that entered was
// one, nothing of ps runs, so no completion calls refill, and the held
// records would wait for good. (Issue 35: after a broker restart took the
// partitions away and gave them back, the first window of a partition was
// work finished before the loss and the rest of its fetch stayed held.)
// Called with mu held, after records entered the window.
func (e *engine) enterWhileIdle(ps *partState) {
	for ps.status == live && ps.held.Len() > 0 && ps.win.Pending() == 0 {
		room := e.cfg.windowRecords - ps.win.Len()
		if room <= 0 {
			return
		}
		ps.held.take(min(room, ps.held.Len()), func(recs []*kgo.Record, meta []recMeta) { e.enterRecords(ps, recs, meta) })
	}
}
