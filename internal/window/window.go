package window

import "fmt"

// Seq identifies one pushed offset within a Window.
//
// Seqs are assigned consecutively from 0 in push order, so a Seq is an index
// into fetch order and is independent of gaps between offsets.
type Seq uint64

type entry struct {
	offset int64
	done   bool
}

// Window is the sliding window of in-flight offsets of one partition.
//
// The zero value is not usable; create one with New. A Window is not safe for
// concurrent use.
type Window struct {
	ring []entry // len is a power of two; entry for seq s lives at ring[s&mask]
	mask uint64

	head Seq // lowest unfinished seq, or tail when every entry is finished
	tail Seq // next seq to be assigned by Push

	pending int   // unfinished entries in [head, tail)
	last    int64 // last pushed offset; -1 before the first Push
	// anyOrder: offsets may be pushed in any order (NewAcquired).
	anyOrder bool
}

const minCap = 8

// New returns an empty Window whose ring is pre-sized to hold sizeHint entries
// (rounded up to a power of two) before it has to grow.
func New(sizeHint int) *Window {
	n := minCap
	for n < sizeHint {
		n <<= 1
	}
	return &Window{
		ring: make([]entry, n),
		mask: uint64(n - 1),
		last: -1,
	}
}

// NewAcquired returns an empty Window whose offsets may be pushed in any
// order, repeated or backwards: the records a share group member acquires,
// which the broker may deliver again below offsets it delivered before.
// Such a window orders its entries by push, not by offset: Start is the
// offset of the oldest unfinished entry, and the finished runs and End mean
// nothing.
func NewAcquired(sizeHint int) *Window {
	w := New(sizeHint)
	w.anyOrder = true
	return w
}

// Push appends offset to the window as unfinished and returns its Seq.
//
// Offsets must be non-negative and, but in a window from NewAcquired,
// strictly increasing across pushes; gaps are allowed (compacted records,
// transaction markers). Push panics otherwise, since a repeated or
// backwards offset means the caller lost track of the partition's
// position.
func (w *Window) Push(offset int64) Seq {
	if (offset <= w.last && !w.anyOrder) || offset < 0 {
		badPush(offset, w.last)
	}
	if int(w.tail-w.head) == len(w.ring) {
		w.grow()
	}
	s := w.tail
	w.ring[uint64(s)&w.mask] = entry{offset: offset}
	w.tail++
	w.pending++
	w.last = offset
	return s
}

func badPush(offset, last int64) {
	if offset < 0 {
		panic(fmt.Sprintf("window: Push(%d): negative offset", offset))
	}
	panic(fmt.Sprintf("window: Push(%d) not above last pushed offset %d", offset, last))
}

// grow doubles the ring, re-homing the live entries [head, tail) so that each
// stays at seq&mask for the new mask.
func (w *Window) grow() {
	ring := make([]entry, 2*len(w.ring))
	mask := uint64(len(ring) - 1)
	for s := w.head; s < w.tail; s++ {
		ring[uint64(s)&mask] = w.ring[uint64(s)&w.mask]
	}
	w.ring, w.mask = ring, mask
}

// Done marks s finished and reports whether the window start (the commit point)
// moved. Done on a seq that is already finished, including one below the start,
// is a no-op returning false. Done panics if s was never pushed.
func (w *Window) Done(s Seq) bool {
	if s >= w.tail {
		panic(fmt.Sprintf("window: Done(%d) on a seq never pushed (next seq %d)", s, w.tail))
	}
	if s < w.head {
		return false
	}
	e := &w.ring[uint64(s)&w.mask]
	if e.done {
		return false
	}
	e.done = true
	w.pending--
	if s != w.head {
		return false
	}
	w.head++
	for w.head < w.tail && w.ring[uint64(w.head)&w.mask].done {
		w.head++
	}
	return true
}

// Start returns the commit point: the offset of the lowest unfinished entry, or
// the last pushed offset + 1 when every entry is finished. ok is false if
// nothing was ever pushed.
func (w *Window) Start() (offset int64, ok bool) {
	if w.head < w.tail {
		return w.ring[uint64(w.head)&w.mask].offset, true
	}
	if w.last < 0 {
		return 0, false
	}
	return w.last + 1, true
}

// Len returns the number of entries held: from the lowest unfinished entry
// through the last pushed one. It is 0 when every entry is finished.
func (w *Window) Len() int { return int(w.tail - w.head) }

// Head returns the seq of the lowest unfinished entry, or the next seq
// Push assigns when every entry is finished: every seq below it is
// finished and no longer held.
func (w *Window) Head() Seq { return w.head }

// Pending returns the number of unfinished entries.
func (w *Window) Pending() int { return w.pending }

// FinishedAbove returns the number of finished entries above the start, that
// is Len() - Pending().
func (w *Window) FinishedAbove() int { return w.Len() - w.pending }

// End returns the last pushed offset + 1, or -1 if nothing was pushed.
func (w *Window) End() int64 {
	if w.last < 0 {
		return -1
	}
	return w.last + 1
}

// AppendFinishedAbove appends to dst, in ascending order, up to max offsets of
// finished entries above the start, and returns the extended slice. Nothing is
// appended if max <= 0.
func (w *Window) AppendFinishedAbove(dst []int64, max int) []int64 {
	n := w.FinishedAbove()
	if max > n {
		max = n
	}
	// The head entry is unfinished whenever any entry above it is finished.
	for s := w.head + 1; max > 0 && s < w.tail; s++ {
		if e := w.ring[uint64(s)&w.mask]; e.done {
			dst = append(dst, e.offset)
			max--
		}
	}
	return dst
}

// EachFinishedRun calls fn, in ascending order, for each run of finished
// entries above the start: from is the offset of the run's first entry and
// to the offset after its last. Offsets between two consecutive entries were
// never pushed (compacted away, transaction markers), so a run spans them.
func (w *Window) EachFinishedRun(fn func(from, to int64)) {
	if w.pending == w.Len() {
		return // nothing finished above the start
	}
	inRun := false
	var from, to int64
	for s := w.head + 1; s < w.tail; s++ {
		e := w.ring[uint64(s)&w.mask]
		switch {
		case e.done && !inRun:
			inRun, from, to = true, e.offset, e.offset+1
		case e.done:
			to = e.offset + 1
		case inRun:
			fn(from, to)
			inRun = false
		}
	}
	if inRun {
		fn(from, to)
	}
}
