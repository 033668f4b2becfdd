// Package sched holds the ordering structures of kpar's scheduler: a FIFO of
// ready tasks and per-partition lanes that keep one task in flight per
// ordering key.
//
// A lane is the unit of ordering. In key mode a lane is a (partition, key
// hash) pair; in partition mode a partition has a single lane; unordered tasks
// bypass lanes and go straight to the ready queue. A lane exists only while it
// has a task in flight: Admit creates it, Release hands over to the next
// parked task or deletes the lane. There is no goroutine per lane or per key,
// and a lane is a slot of a table, so steady-state scheduling does not
// allocate.
//
// A partition's wide lane orders every task admitted to it, whatever its
// key, outside the table of key lanes: it is partition mode's single lane,
// the engine's key and unordered modes use it while the handler is cheap,
// and Split moves its tasks onto their keys' lanes (or out of the lanes)
// when they must not wait for each other.
//
// Nothing here locks or starts goroutines: the caller owns the mutex.
package sched

// Task is one schedulable unit. Value carries the caller's payload; the
// remaining fields are the scheduler's bookkeeping.
type Task[T any] struct {
	Value T

	next  *Task[T]
	lane  uint32 // laneKey of its key
	laned bool
	wide  bool // admitted to the wide lane (AdmitWide) and not split off it
}

// Wide reports whether t holds or waits for its partition's wide lane.
func (t *Task[T]) Wide() bool { return t.wide }

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

// Any reports whether f is true for a queued task, calling it in order
// until it is. It walks the queue: for rare decisions, not per task.
func (q *Queue[T]) Any(f func(*Task[T]) bool) bool {
	for t := q.head; t != nil; t = t.next {
		if f(t) {
			return true
		}
	}
	return false
}

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

// Lanes tracks the busy lanes of one partition. The zero value is ready to
// use.
//
// Busy lanes live in an open-addressing table with linear probing and
// backward-shift deletion rather than a map: a lane is created and deleted
// for nearly every record when keys rarely repeat, and this is the hot path
// under the engine's lock. The table is split in two parallel arrays: the
// keys, which every probe walks and which stay small enough to sit in the
// CPU's cache, and the parked tasks, touched only for a lane whose key
// repeated (its slot carries parkedBit). Keys are expected to be well mixed
// (the engine passes maphash values), so a key's home slot is its low bits.
// Slots hold 31 bits of the key (folded from its 64): 0 is empty and the
// top bit is the flag. Two keys that fold alike share a lane, which only
// orders them more strictly, and with a thousand lanes busy that happens to
// one record in millions; in exchange a partition's keys take 16 KiB, not
// 64, of the cache the broker's data streams through.
type Lanes[T any] struct {
	keys   []uint32   // len is a power of two, at least four times busy: short probe runs
	parked []Queue[T] // parked[i] waits behind the lane of keys[i]; empty unless keys[i] has parkedBit
	busy   int

	// The wide lane: its in-flight task (nil when idle) and the tasks
	// waiting behind it, outside the table.
	wideHolder *Task[T]
	wideParked Queue[T]
}

const parkedBit = 1 << 31

func laneKey(key uint64) uint32 { return max(uint32(key^key>>32)&^parkedBit, 1) }

// find returns the slot of key, or the empty slot where it would go.
func (l *Lanes[T]) find(key uint32) (int, bool) {
	mask := len(l.keys) - 1
	for i := int(key) & mask; ; i = (i + 1) & mask {
		switch k := l.keys[i] &^ parkedBit; k {
		case 0:
			return i, false
		case key:
			return i, true
		}
	}
}

func (l *Lanes[T]) grow() {
	oldKeys, oldParked := l.keys, l.parked
	n := max(16, 2*len(oldKeys))
	l.keys, l.parked = make([]uint32, n), make([]Queue[T], n)
	for j, k := range oldKeys {
		if k != 0 {
			i, _ := l.find(k &^ parkedBit)
			l.keys[i], l.parked[i] = k, oldParked[j]
		}
	}
}

// remove empties slot i, whose lane has nothing parked, shifting later
// entries of its probe run back so that every key stays reachable from its
// home slot.
func (l *Lanes[T]) remove(i int) {
	mask := len(l.keys) - 1
	for j := (i + 1) & mask; l.keys[j] != 0; j = (j + 1) & mask {
		home := int(l.keys[j]&^parkedBit) & mask
		// The entry at j may move to i only if its home is not in the
		// cyclic range (i, j].
		if (i < j && (home <= i || home > j)) || (i > j && home <= i && home > j) {
			l.keys[i] = l.keys[j]
			if l.keys[j]&parkedBit != 0 {
				l.parked[i], l.parked[j] = l.parked[j], Queue[T]{}
			}
			i = j
		}
	}
	l.keys[i] = 0
	l.busy--
}

// Admit binds t to lane key. It reports true when the lane was idle: t is
// now the lane's in-flight task and the caller makes it ready. Otherwise t is
// parked behind the lane's earlier tasks and Release will hand it over.
func (l *Lanes[T]) Admit(t *Task[T], key uint64) bool {
	k := laneKey(key)
	t.lane, t.laned = k, true
	if 4*(l.busy+1) > len(l.keys) {
		l.grow()
	}
	i, ok := l.find(k)
	if ok {
		l.parked[i].Push(t)
		l.keys[i] |= parkedBit
		return false
	}
	l.keys[i] = k
	l.busy++
	return true
}

// popParked removes the next parked task of slot i, or returns nil.
func (l *Lanes[T]) popParked(i int) *Task[T] {
	if l.keys[i]&parkedBit == 0 {
		return nil
	}
	next := l.parked[i].Pop()
	if l.parked[i].Len() == 0 {
		l.keys[i] &^= parkedBit
	}
	return next
}

// AdmitWide binds t to the wide lane, behind every task admitted to it
// before, whatever their keys. It reports true when the lane was idle: t is
// now its in-flight task and the caller makes it ready. Otherwise t is
// parked and Release (or Split) hands it over.
func (l *Lanes[T]) AdmitWide(t *Task[T]) bool {
	t.wide, t.laned = true, true
	if l.wideHolder == nil {
		l.wideHolder = t
		return true
	}
	l.wideParked.Push(t)
	return false
}

// WideParked returns the number of tasks waiting behind the wide lane.
func (l *Lanes[T]) WideParked() int { return l.wideParked.Len() }

// Split closes the wide lane: its in-flight task moves to the lane of its
// own key, and the tasks parked behind it, in order, are admitted to their
// keys' lanes as Admit does. ready receives each one that found its lane
// idle and may run now; the others wait behind a task of their own key.
// key returns a task's key, and false for a task that needs no lane: it
// leaves the lanes (Release returns nil for it) and, if parked, is ready.
//
// Split requires that no key lane be busy while the wide lane is, so that
// the in-flight task takes its key's lane over at once; the engine opens
// the wide lane only when no lane is busy (Busy) and admits to key lanes
// only once it split.
func (l *Lanes[T]) Split(key func(*Task[T]) (uint64, bool), ready func(*Task[T])) {
	h := l.wideHolder
	if h == nil {
		return
	}
	l.wideHolder = nil
	h.wide = false
	if k, ok := key(h); ok {
		l.Admit(h, k)
	} else {
		h.laned = false
	}
	for t := l.wideParked.Pop(); t != nil; t = l.wideParked.Pop() {
		t.wide = false
		k, ok := key(t)
		if !ok {
			t.laned = false
			ready(t)
		} else if l.Admit(t, k) {
			ready(t)
		}
	}
}

// Release ends t's turn on its lane and returns the lane's next task, which
// the caller makes ready, or nil when the lane is now idle. Release on a task
// that was never admitted returns nil.
func (l *Lanes[T]) Release(t *Task[T]) *Task[T] {
	if t.wide {
		if l.wideHolder != t {
			return nil
		}
		t.wide = false
		l.wideHolder = l.wideParked.Pop()
		return l.wideHolder
	}
	if !t.laned || l.busy == 0 {
		return nil
	}
	i, ok := l.find(t.lane)
	if !ok {
		return nil
	}
	if next := l.popParked(i); next != nil {
		return next
	}
	l.remove(i)
	return nil
}

// TakeNext removes and returns the next parked task on t's lane while the
// lane stays busy, so a batch can carry several consecutive tasks of one
// key. The lane's turn passes from t to the returned task: Release(t) then
// returns nil, and only the returned task's Release hands the lane on, so
// releasing every task of a batch makes one successor ready, not one per
// task. It returns nil when nothing is parked, and for a task of the wide
// lane, which batches do not take from.
func (l *Lanes[T]) TakeNext(t *Task[T]) *Task[T] {
	if t.wide || !t.laned || l.busy == 0 {
		return nil
	}
	if i, ok := l.find(t.lane); ok {
		next := l.popParked(i)
		if next != nil {
			t.laned = false
		}
		return next
	}
	return nil
}

// GiveBack undoes TakeNext for a batch whose attempt failed: the taken
// tasks (in the order TakeNext returned them) go back to the front of
// holder's lane, and the turn returns to holder, so the batch is retried
// after holder and no task of the lane overtakes another.
func (l *Lanes[T]) GiveBack(holder *Task[T], taken []*Task[T]) {
	if holder.wide || len(taken) == 0 || l.busy == 0 {
		return
	}
	i, ok := l.find(holder.lane)
	if !ok {
		return
	}
	q := &l.parked[i]
	for j := len(taken) - 1; j >= 0; j-- {
		t := taken[j]
		t.laned = true
		t.next = q.head
		if q.head = t; q.tail == nil {
			q.tail = t
		}
		q.n++
	}
	l.keys[i] |= parkedBit
	holder.laned = true
}

// Busy returns the number of lanes with a task in flight, the wide lane
// included.
func (l *Lanes[T]) Busy() int {
	if l.wideHolder != nil {
		return l.busy + 1
	}
	return l.busy
}

// Parked returns the number of tasks waiting behind busy lanes. It walks
// every lane, so it is meant for snapshots, not hot paths.
func (l *Lanes[T]) Parked() int {
	n := l.wideParked.Len()
	for i := range l.parked {
		n += l.parked[i].Len()
	}
	return n
}

// Withdraw takes out of the lanes every parked task for which keep returns
// false, and passes each to out: those of the wide lane first, then the
// key lanes', each lane's in order. The tasks in flight, and the parked
// tasks kept, keep their places. A task taken out leaves the lanes
// (Release returns nil for it). out must not admit tasks to these lanes.
func (l *Lanes[T]) Withdraw(keep func(*Task[T]) bool, out func(*Task[T])) {
	filter := func(q *Queue[T]) {
		var stay Queue[T]
		for t := q.Pop(); t != nil; t = q.Pop() {
			if keep(t) {
				stay.Push(t)
				continue
			}
			t.wide, t.laned = false, false
			out(t)
		}
		*q = stay
	}
	filter(&l.wideParked)
	for i := range l.parked {
		if l.keys[i]&parkedBit == 0 {
			continue
		}
		filter(&l.parked[i])
		if l.parked[i].Len() == 0 {
			l.keys[i] &^= parkedBit
		}
	}
}

// ExpandWide rebuilds the wide lane's order when some of its tasks stand
// for several records and must give some of them back as tasks of their
// own: expand returns, for the lane's in-flight task and for each parked
// one, the tasks to place right behind it, in order. The lane's order is
// otherwise unchanged.
func (l *Lanes[T]) ExpandWide(expand func(*Task[T]) []*Task[T]) {
	if l.wideHolder == nil {
		return
	}
	var q Queue[T]
	add := func(ts []*Task[T]) {
		for _, t := range ts {
			t.wide, t.laned = true, true
			q.Push(t)
		}
	}
	add(expand(l.wideHolder))
	for t := l.wideParked.Pop(); t != nil; t = l.wideParked.Pop() {
		q.Push(t)
		add(expand(t))
	}
	l.wideParked = q
}

// Replace gives old's turn on its lane (the wide lane or its key's lane),
// in flight, to t. On the wide lane the tasks of front are then parked
// right behind t, in order, before every task parked there already: old
// stood for several tasks, the first of them failed, and the others must
// keep their places. front must be empty unless old holds the wide lane.
func (l *Lanes[T]) Replace(old, t *Task[T], front []*Task[T]) {
	t.wide, t.laned, t.lane = old.wide, old.laned, old.lane
	old.wide, old.laned = false, false
	if !t.wide {
		if len(front) > 0 {
			panic("sched: Replace parks tasks behind a task that does not hold the wide lane")
		}
		return // a key lane is found by its key, not by its task
	}
	if l.wideHolder == old {
		l.wideHolder = t
	}
	q := &l.wideParked
	for j := len(front) - 1; j >= 0; j-- {
		f := front[j]
		f.wide, f.laned = true, true
		f.next = q.head
		if q.head = f; q.tail == nil {
			q.tail = f
		}
		q.n++
	}
}
