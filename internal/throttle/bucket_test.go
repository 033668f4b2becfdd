package throttle

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestBucketStartsFullAndRefillsAtRate(t *testing.T) {
	b := NewBucket(10, 3) // a token every 100ms
	for i := range 3 {
		if ok, _ := b.Ready(at(0)); !ok {
			t.Fatalf("start %d of the burst refused", i+1)
		}
		b.Take(at(0), 1)
	}
	ok, wait := b.Ready(at(0))
	if ok || wait != 100*time.Millisecond {
		t.Fatalf("after the burst: ok %v, wait %v; want false, 100ms", ok, wait)
	}
	if ok, wait := b.Ready(at(60)); ok || wait != 40*time.Millisecond {
		t.Fatalf("60ms later: ok %v, wait %v; want false, 40ms", ok, wait)
	}
	if ok, _ := b.Ready(at(100)); !ok {
		t.Fatal("100ms later: refused, want a token")
	}
}

func TestBucketNeverHoldsMoreThanBurst(t *testing.T) {
	b := NewBucket(1000, 5)
	b.Ready(at(0))
	starts := 0
	for {
		if ok, _ := b.Ready(at(60_000)); !ok {
			break
		}
		b.Take(at(60_000), 1)
		starts++
	}
	if starts != 5 {
		t.Fatalf("a minute idle allowed %d starts at once, want the burst, 5", starts)
	}
}

func TestBucketBatchDebtDelaysTheNextStart(t *testing.T) {
	b := NewBucket(100, 1) // a token every 10ms
	b.Take(at(0), 5)       // a batch of 5 that passed Ready with one token
	ok, wait := b.Ready(at(0))
	if ok || wait != 50*time.Millisecond {
		t.Fatalf("after a batch of 5 on 1 token: ok %v, wait %v; want false, 50ms (4 owed + 1)", ok, wait)
	}
}

func TestBucketReserveSpacesStarts(t *testing.T) {
	b := NewBucket(10, 2)
	var waits []time.Duration
	for range 5 {
		waits = append(waits, b.Reserve(at(0)))
	}
	want := []time.Duration{0, 0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("reservation waits %v, want %v", waits, want)
		}
	}
	// 300ms later every reservation is paid and nothing is left over.
	if ok, wait := b.Ready(at(300)); ok || wait != 100*time.Millisecond {
		t.Fatalf("at 300ms: ok %v, wait %v; want false, 100ms", ok, wait)
	}
}

func TestBucketIgnoresTimeGoingBack(t *testing.T) {
	b := NewBucket(10, 1)
	b.Take(at(1000), 1)
	if ok, _ := b.Ready(at(0)); ok {
		t.Fatal("a clock reading from before the last use added tokens")
	}
	if ok, _ := b.Ready(at(1100)); !ok {
		t.Fatal("100ms after the last use: refused")
	}
}

// TestBucketRate checks the long-run rate: starts taken as soon as Ready
// allows, over simulated time, stay within burst of perSecond x elapsed.
func TestBucketRate(t *testing.T) {
	for _, tc := range []struct {
		perSecond float64
		burst     int
	}{{500, 1}, {500, 50}, {0.5, 1}, {3, 7}, {20000, 100}} {
		b := NewBucket(tc.perSecond, tc.burst)
		now := t0
		end := t0.Add(20 * time.Second)
		starts := 0
		for now.Before(end) {
			ok, wait := b.Ready(now)
			if !ok {
				now = now.Add(wait)
				continue
			}
			b.Take(now, 1)
			starts++
		}
		limit := tc.perSecond*20 + float64(tc.burst)
		if float64(starts) > limit+0.001 || float64(starts) < limit-1 {
			t.Errorf("rate %v burst %d: %d starts in 20s, want %v (rate x time + burst)", tc.perSecond, tc.burst, starts, limit)
		}
	}
}

func TestBucketFull(t *testing.T) {
	b := NewBucket(10, 2)
	if !b.Full(at(0)) {
		t.Fatal("a fresh bucket is not full")
	}
	b.Take(at(0), 1)
	if b.Full(at(50)) {
		t.Fatal("full 50ms after a start, want 100ms")
	}
	if !b.Full(at(100)) {
		t.Fatal("not full 100ms after a start")
	}
}
