package throttle

import (
	"testing"
	"time"
)

func TestKeysLimitEachKeyAlone(t *testing.T) {
	k := NewKeys(10, 1, 100)
	if w := k.Reserve(at(0), 1); w != 0 {
		t.Fatalf("key 1's first start waits %v, want 0", w)
	}
	if w := k.Reserve(at(0), 1); w != 100*time.Millisecond {
		t.Fatalf("key 1's second start waits %v, want 100ms", w)
	}
	if w := k.Reserve(at(0), 2); w != 0 {
		t.Fatalf("key 2 waits %v behind key 1, want 0: keys are limited apart", w)
	}
}

func TestKeysStayWithinCapacity(t *testing.T) {
	k := NewKeys(1, 1, 64)
	for i := range uint64(100_000) {
		k.Reserve(at(0), i)
		k.Reserve(at(0), i) // owes a token: not full, not droppable
		if k.Len() > 64 {
			t.Fatalf("after %d keys the table holds %d buckets, want at most 64", i+1, k.Len())
		}
	}
	if len(k.nodes) > 64 {
		t.Fatalf("%d nodes allocated, want at most 64", len(k.nodes))
	}
}

func TestKeysDropFullBucketsFirst(t *testing.T) {
	k := NewKeys(10, 1, 3)
	k.Reserve(at(0), 1) // refills by 100ms
	k.Reserve(at(0), 2)
	k.Reserve(at(0), 2) // its second start is due at 100ms; at 150ms it holds half a token
	if k.Len() != 2 {
		t.Fatalf("Len %d, want 2", k.Len())
	}
	// At 150ms key 1 (the least recently used) is full again: the next
	// call forgets it, and key 2, still owing, is kept.
	k.Reserve(at(150), 3)
	if _, ok := k.index[1]; ok {
		t.Fatal("key 1's full bucket was kept")
	}
	if _, ok := k.index[2]; !ok {
		t.Fatal("key 2's owing bucket was dropped")
	}
	// Key 2's state survived: its next start waits for the other half.
	if w := k.Reserve(at(150), 2); w != 50*time.Millisecond {
		t.Fatalf("key 2 waits %v, want 50ms (a fresh bucket would give 0)", w)
	}
}

func TestKeysEvictLeastRecentlyUsedWhenFull(t *testing.T) {
	k := NewKeys(1, 1, 2)
	k.Reserve(at(0), 1)
	k.Reserve(at(0), 1) // key 1 owes
	k.Reserve(at(0), 2)
	k.Reserve(at(0), 2) // key 2 owes
	k.Reserve(at(0), 1) // key 1 used again: key 2 is now least recent
	k.Reserve(at(0), 3) // no room: evicts key 2
	if _, ok := k.index[2]; ok {
		t.Fatal("key 2, least recently used, was not evicted")
	}
	if _, ok := k.index[1]; !ok {
		t.Fatal("key 1, used more recently, was evicted")
	}
	// Key 2 comes back with a fresh bucket: the documented cost.
	if w := k.Reserve(at(0), 2); w != 0 {
		t.Fatalf("evicted key 2 waits %v, want 0 (a fresh bucket)", w)
	}
}

// TestKeysListStaysConsistent walks the LRU list after a mixed workload:
// every indexed node is on it once, in both directions.
func TestKeysListStaysConsistent(t *testing.T) {
	k := NewKeys(100, 2, 50)
	now := t0
	for i := range 10_000 {
		now = now.Add(time.Duration(i%7) * time.Millisecond)
		k.Reserve(now, uint64(i*7919%173))
		var fwd []int32
		for n := k.head; n >= 0; n = k.nodes[n].next {
			fwd = append(fwd, n)
			if len(fwd) > k.capacity {
				t.Fatal("the list loops")
			}
		}
		if len(fwd) != k.Len() {
			t.Fatalf("step %d: %d nodes on the list, %d indexed", i, len(fwd), k.Len())
		}
		back := 0
		for n := k.tail; n >= 0; n = k.nodes[n].prev {
			back++
		}
		if back != len(fwd) {
			t.Fatalf("step %d: %d nodes forwards, %d backwards", i, len(fwd), back)
		}
		for _, n := range fwd {
			if k.index[k.nodes[n].key] != n {
				t.Fatalf("step %d: node %d not indexed under its key", i, n)
			}
		}
	}
}
