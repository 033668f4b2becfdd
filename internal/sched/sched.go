// Package sched holds the ordering structures of kpar's scheduler: a FIFO of
// ready tasks and per-partition lanes that keep one task in flight per
// ordering key.
//
// A lane is the unit of ordering. In key mode a lane is a (partition, key
// hash) pair; in partition mode a partition has a single lane; unordered tasks
// bypass lanes and go straight to the ready queue. A lane exists only while it
// has a task in flight: Admit creates it, Release hands over to the next
// parked task or deletes the lane. There is no goroutine per lane or per key,
// and lanes are recycled through a free list, so steady-state scheduling does
// not allocate.
//
// Nothing here locks or starts goroutines: the caller owns the mutex.
package sched

// Task is one schedulable unit. Value carries the caller's payload; the
// remaining fields are the scheduler's bookkeeping.
type Task[T any] struct {
	Value T

	next  *Task[T]
	lane  uint64
	laned bool
}

// Queue is an intrusive FIFO of tasks. The zero value is an empty queue.
type Queue[T any] struct {
	head, tail *Task[T]
	n          int
}

// Len returns the number of queued tasks.
func (q *Queue[T]) Len() int { return q.n }

// Push appends t.
func (q *Queue[T]) Push(t *Task[T]) {
	t.next = nil
	if q.tail == nil {
		q.head = t
	} else {
		q.tail.next = t
	}
	q.tail = t
	q.n++
}

// Peek returns the first task without removing it, or nil.
func (q *Queue[T]) Peek() *Task[T] { return q.head }

// Pop removes and returns the first task, or nil when empty.
func (q *Queue[T]) Pop() *Task[T] {
	t := q.head
	if t == nil {
		return nil
	}
	q.head = t.next
	if q.head == nil {
		q.tail = nil
	}
	t.next = nil
	q.n--
	return t
}

type lane[T any] struct {
	parked Queue[T]
	free   *lane[T]
}

// laneSlot is one slot of the open-addressing table of busy lanes; ln is
// nil when the slot is empty.
type laneSlot[T any] struct {
	key uint64
	ln  *lane[T]
}

// Lanes tracks the busy lanes of one partition. The zero value is ready to
// use.
//
// Busy lanes live in an open-addressing table with linear probing and
// backward-shift deletion rather than a map: a lane is created and deleted
// for nearly every record when keys rarely repeat, and this is the hot path
// under the engine's lock. Keys are expected to be well mixed (the engine
// passes maphash values), so a key's home slot is its low bits.
type Lanes[T any] struct {
	slots []laneSlot[T] // len is a power of two, at least twice busy
	busy  int
	free  *lane[T]
}

// find returns the slot of key, or the empty slot where it would go.
func (l *Lanes[T]) find(key uint64) (int, bool) {
	mask := len(l.slots) - 1
	for i := int(key) & mask; ; i = (i + 1) & mask {
		switch s := &l.slots[i]; {
		case s.ln == nil:
			return i, false
		case s.key == key:
			return i, true
		}
	}
}

func (l *Lanes[T]) grow() {
	old := l.slots
	l.slots = make([]laneSlot[T], max(16, 2*len(old)))
	for _, s := range old {
		if s.ln != nil {
			i, _ := l.find(s.key)
			l.slots[i] = s
		}
	}
}

// remove empties slot i, shifting later entries of its probe run back so
// that every key stays reachable from its home slot.
func (l *Lanes[T]) remove(i int) {
	mask := len(l.slots) - 1
	for j := (i + 1) & mask; l.slots[j].ln != nil; j = (j + 1) & mask {
		home := int(l.slots[j].key) & mask
		// The entry at j may move to i only if its home is not in the
		// cyclic range (i, j].
		if (i < j && (home <= i || home > j)) || (i > j && home <= i && home > j) {
			l.slots[i] = l.slots[j]
			i = j
		}
	}
	l.slots[i] = laneSlot[T]{}
	l.busy--
}

// Admit binds t to lane key. It reports true when the lane was idle: t is
// now the lane's in-flight task and the caller makes it ready. Otherwise t is
// parked behind the lane's earlier tasks and Release will hand it over.
func (l *Lanes[T]) Admit(t *Task[T], key uint64) bool {
	t.lane, t.laned = key, true
	if 2*(l.busy+1) > len(l.slots) {
		l.grow()
	}
	i, ok := l.find(key)
	if ok {
		l.slots[i].ln.parked.Push(t)
		return false
	}
	ln := l.free
	if ln != nil {
		l.free = ln.free
		ln.free = nil
	} else {
		ln = new(lane[T])
	}
	l.slots[i] = laneSlot[T]{key: key, ln: ln}
	l.busy++
	return true
}

// Release ends t's turn on its lane and returns the lane's next task, which
// the caller makes ready, or nil when the lane is now idle. Release on a task
// that was never admitted returns nil.
func (l *Lanes[T]) Release(t *Task[T]) *Task[T] {
	if !t.laned || l.busy == 0 {
		return nil
	}
	i, ok := l.find(t.lane)
	if !ok {
		return nil
	}
	ln := l.slots[i].ln
	if next := ln.parked.Pop(); next != nil {
		return next
	}
	l.remove(i)
	ln.free = l.free
	l.free = ln
	return nil
}

// TakeNext removes and returns the next parked task on t's lane while the
// lane stays busy, so a batch can carry several consecutive tasks of one
// key. It returns nil when nothing is parked.
func (l *Lanes[T]) TakeNext(t *Task[T]) *Task[T] {
	if !t.laned || l.busy == 0 {
		return nil
	}
	if i, ok := l.find(t.lane); ok {
		return l.slots[i].ln.parked.Pop()
	}
	return nil
}

// Busy returns the number of lanes with a task in flight.
func (l *Lanes[T]) Busy() int { return l.busy }

// Parked returns the number of tasks waiting behind busy lanes. It walks
// every lane, so it is meant for snapshots, not hot paths.
func (l *Lanes[T]) Parked() int {
	n := 0
	for _, s := range l.slots {
		if s.ln != nil {
			n += s.ln.parked.Len()
		}
	}
	return n
}
