package kpar

// heldQueue holds, in offset order, the fetched records of a partition that
// did not fit in its window (see partState.held). It keeps the slabs that
// prepare built, not a pointer per record: holding a fetch's records costs
// one append, not one per record, and they enter the window from the same
// memory, in order.
type heldQueue struct {
	slabs [][]task // slabs[0][0] is the next record to enter
	n     int
}

// Len returns the number of held records.
func (q *heldQueue) Len() int { return q.n }

// push holds tasks, whose offsets follow those already held.
func (q *heldQueue) push(tasks []task) {
	if len(tasks) == 0 {
		return
	}
	q.slabs = append(q.slabs, tasks)
	q.n += len(tasks)
}

// lastOffset returns the offset of the last held record; q must not be
// empty.
func (q *heldQueue) lastOffset() int64 {
	s := q.slabs[len(q.slabs)-1]
	return s[len(s)-1].Value.offset
}

// take removes the first n held records (n at most Len), calling fn on each
// in order.
func (q *heldQueue) take(n int, fn func(*task)) {
	q.n -= n
	for n > 0 {
		s := q.slabs[0]
		k := min(n, len(s))
		for i := range s[:k] {
			fn(&s[i])
		}
		n -= k
		if k < len(s) {
			q.slabs[0] = s[k:]
			continue
		}
		q.slabs[0] = nil
		q.slabs = q.slabs[1:]
	}
	if q.n == 0 {
		q.slabs = nil
	}
}

// reset forgets every held record.
func (q *heldQueue) reset() { *q = heldQueue{} }
