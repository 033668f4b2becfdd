package limit

import (
	"testing"
	"time"
)

// simulate runs a closed loop against a downstream that takes rtt and
// rejects (overload) whatever runs beyond capacity, and returns the limit
// after steps rounds and how many attempts were rejected.
func simulate(a *Adaptive, capacity int, rtt time.Duration, steps int) (rejected int) {
	now := time.Unix(0, 0)
	for range steps {
		n := 0
		for ok, _ := a.Allow(now, n); ok; ok, _ = a.Allow(now, n) {
			n++
		}
		now = now.Add(rtt)
		for i := range n {
			over := i >= capacity
			if over {
				rejected++
			}
			a.Done(now, rtt, over)
		}
		if n == 0 {
			now = now.Add(a.pause)
		}
	}
	return rejected
}

func TestAdaptiveConvergesOnCapacity(t *testing.T) {
	a := New(256)
	simulate(a, 16, 5*time.Millisecond, 200)
	if l := a.Limit(); l < 11 || l > 17 {
		t.Fatalf("limit %d after 200 rounds against a capacity of 16, want 11 to 17", l)
	}
}

func TestAdaptiveGrowsToTheCeilingWhenHealthy(t *testing.T) {
	a := New(64)
	simulate(a, 1000, time.Millisecond, 20)
	if a.Limit() != 64 {
		t.Fatalf("limit %d, want the ceiling 64", a.Limit())
	}
}

func TestAdaptivePausesAtTheFloor(t *testing.T) {
	a := New(8)
	now := time.Unix(0, 0)
	for range 20 {
		a.Done(now, time.Millisecond, true)
		now = now.Add(time.Second)
	}
	if a.Limit() != 1 {
		t.Fatalf("limit %d after an outage, want 1", a.Limit())
	}
	ok, wait := a.Allow(now.Add(-time.Second), 0)
	if ok || wait <= 0 || wait > MaxPause {
		t.Fatalf("Allow during an outage = %v, %v: want a pause", ok, wait)
	}
	a.Done(now, time.Millisecond, false) // the probe succeeded
	if ok, _ := a.Allow(now, 0); !ok {
		t.Fatal("still paused after a success")
	}
}

func TestAdaptiveCutsOncePerWave(t *testing.T) {
	a := New(100)
	for range 10 {
		a.Done(time.Unix(0, 0), time.Millisecond, false)
	}
	before := a.limit
	now := time.Unix(1, 0)
	for range 50 { // one wave of rejections at the same moment
		a.Done(now, time.Millisecond, true)
	}
	if a.limit != before*decrease {
		t.Fatalf("limit %.1f after one wave from %.1f, want one cut to %.1f", a.limit, before, before*decrease)
	}
}
