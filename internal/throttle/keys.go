package throttle

import "time"

// Keys is a bounded table of buckets, one per key (the caller hashes the
// record key to a uint64), all with the same rate and burst. The zero
// value is not usable; use NewKeys.
//
// Memory stays within capacity buckets however many keys pass. A key's
// bucket that refilled to burst equals a fresh one, so such buckets are
// dropped as they come to the least recently used end (a few per call).
// When the table is full of buckets that still owe or lack tokens, a new
// key takes the place of the least recently used one: that key, should it
// come back, starts with a full bucket again, so it may start up to burst
// records early. With capacity well above the keys active within
// burst/perSecond seconds, that never happens.
type Keys struct {
	perSecond float64
	burst     int
	capacity  int
	index     map[uint64]int32 // key -> position in nodes
	nodes     []node           // at most capacity; free ones listed in free
	free      []int32
	head      int32 // most recently used, -1 when empty
	tail      int32 // least recently used, -1 when empty
}

type node struct {
	key        uint64
	b          Bucket
	prev, next int32 // towards head, towards tail; -1 at the ends
}

// sweep bounds how many full buckets one call drops, so every call costs
// O(1).
const sweep = 2

// NewKeys returns an empty table of at most capacity buckets (at least 1).
func NewKeys(perSecond float64, burst, capacity int) *Keys {
	capacity = max(capacity, 1)
	return &Keys{
		perSecond: perSecond, burst: burst, capacity: capacity,
		index: make(map[uint64]int32), head: -1, tail: -1,
	}
}

// Len is how many buckets the table holds.
func (k *Keys) Len() int { return len(k.index) }

// Reserve takes a token from key's bucket now and returns how long until
// the start it pays for may happen (see Bucket.Reserve).
func (k *Keys) Reserve(now time.Time, key uint64) (wait time.Duration) {
	k.dropFull(now)
	i, ok := k.index[key]
	if ok {
		k.unlink(i)
	} else {
		i = k.place(key)
	}
	k.pushFront(i)
	return k.nodes[i].b.Reserve(now)
}

// dropFull forgets up to sweep buckets at the least recently used end that
// refilled: they equal fresh ones.
func (k *Keys) dropFull(now time.Time) {
	for range sweep {
		t := k.tail
		if t < 0 || !k.nodes[t].b.Full(now) {
			return
		}
		k.unlink(t)
		delete(k.index, k.nodes[t].key)
		k.free = append(k.free, t)
	}
}

// place returns a node for a new key with a fresh bucket: a free node, a
// new one below capacity, else the least recently used one, evicted.
func (k *Keys) place(key uint64) int32 {
	var i int32
	switch {
	case len(k.free) > 0:
		i = k.free[len(k.free)-1]
		k.free = k.free[:len(k.free)-1]
	case len(k.nodes) < k.capacity:
		k.nodes = append(k.nodes, node{})
		i = int32(len(k.nodes) - 1)
	default:
		i = k.tail
		k.unlink(i)
		delete(k.index, k.nodes[i].key)
	}
	k.nodes[i] = node{key: key, b: NewBucket(k.perSecond, k.burst), prev: -1, next: -1}
	k.index[key] = i
	return i
}

func (k *Keys) unlink(i int32) {
	n := &k.nodes[i]
	if n.prev >= 0 {
		k.nodes[n.prev].next = n.next
	} else {
		k.head = n.next
	}
	if n.next >= 0 {
		k.nodes[n.next].prev = n.prev
	} else {
		k.tail = n.prev
	}
	n.prev, n.next = -1, -1
}

func (k *Keys) pushFront(i int32) {
	n := &k.nodes[i]
	n.prev, n.next = -1, k.head
	if k.head >= 0 {
		k.nodes[k.head].prev = i
	}
	k.head = i
	if k.tail < 0 {
		k.tail = i
	}
}
