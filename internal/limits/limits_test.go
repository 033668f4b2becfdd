package limits

import (
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestAFixedConcurrencyWithoutRatesIsNotGatedUntilTheBreakerOpens(t *testing.T) {
	g := New(Config{Concurrency: 4})
	if g.Gated() || g.Measures() || g.Rated() || g.Keyed() || g.Paced() {
		t.Fatalf("a fixed concurrency: gated %v measures %v rated %v", g.Gated(), g.Measures(), g.Rated())
	}
	g.Took(2)
	now := t0
	// Overload signals with no success for longer than the breaker's
	// quiet open it.
	g.Done(now, now.Add(-time.Millisecond), true)
	now = now.Add(300 * time.Millisecond)
	g.Done(now, now.Add(-time.Millisecond), true)
	if !g.Open() || !g.Gated() {
		t.Fatalf("after overload past the quiet: open %v gated %v, want both", g.Open(), g.Gated())
	}
	if ok, wait := g.Allow(now); ok || wait <= 0 {
		t.Fatalf("open breaker in its pause: ok %v wait %v, want a wait", ok, wait)
	}
	if ok, wait := g.Allow(now.Add(time.Second)); !ok || wait != 0 {
		t.Fatalf("after the pause: ok %v wait %v, want a probe", ok, wait)
	}
	g.Took(1)
	if ok, wait := g.Allow(now.Add(time.Second)); ok || wait != 0 {
		t.Fatalf("a probe runs: ok %v wait %v, want none and no wait (its end decides)", ok, wait)
	}
	if !g.Done(now.Add(time.Second), now, false) || g.Open() {
		t.Fatal("the probe's success did not close the breaker")
	}
	if g.Active() != 0 {
		t.Fatalf("active %d after every attempt ended, want 0", g.Active())
	}
}

func TestTheAdaptiveLimitBoundsTheAttemptsRunning(t *testing.T) {
	g := New(Config{Concurrency: 64, Adaptive: true})
	if !g.Gated() || !g.Measures() || g.Open() || g.Watching() {
		t.Fatal("the adaptive limit is on: gated and measuring, no breaker")
	}
	lim, on := g.Limit()
	if !on || lim != 4 {
		t.Fatalf("limit %d (on %v), want 4 at the start", lim, on)
	}
	g.Took(lim)
	if ok, wait := g.Allow(t0); ok || wait != 0 {
		t.Fatalf("at the limit: ok %v wait %v, want no start and no wait (an end decides)", ok, wait)
	}
	if !g.Done(t0.Add(time.Millisecond), t0, false) {
		t.Fatal("an end under the adaptive limit asks for a wake-up")
	}
	if ok, _ := g.Allow(t0); !ok {
		t.Fatal("an attempt ended and the limit grew: a start is allowed")
	}
}

func TestRateLimitPacesStarts(t *testing.T) {
	g := New(Config{Concurrency: 8, Rate: Rate{PerSecond: 10, Burst: 2}})
	if !g.Gated() || !g.Paced() || !g.Rated() || g.Keyed() {
		t.Fatal("RateLimit on: gated, paced and rated, not keyed")
	}
	g.Took(2)
	g.Charge(t0, 2)
	ok, wait := g.Allow(t0)
	if ok || wait <= 0 || wait > 100*time.Millisecond {
		t.Fatalf("burst spent: ok %v wait %v, want a wait of at most 100ms", ok, wait)
	}
	if ok, _ := g.Allow(t0.Add(wait)); !ok {
		t.Fatal("the wait Allow gave did not bring a token")
	}
}

func TestKeyRateLimitGivesAHotKeysRecordsDistinctDueTimes(t *testing.T) {
	g := New(Config{Concurrency: 8, KeyRate: Rate{PerSecond: 10, Burst: 1}, KeyBuckets: 4})
	if !g.Keyed() || !g.Rated() || g.Paced() {
		t.Fatal("KeyRateLimit on: keyed and rated, not paced")
	}
	if w := g.KeyWait(t0, 7); w > 0 {
		t.Fatalf("the key's first record waits %v", w)
	}
	w1, w2 := g.KeyWait(t0, 7), g.KeyWait(t0, 7)
	if w1 <= 0 || w2 <= w1 {
		t.Fatalf("a hot key's next records wait %v then %v, want growing waits", w1, w2)
	}
	if w := g.KeyWait(t0, 8); w > 0 || g.Keys() != 2 {
		t.Fatalf("another key waits %v with %d keys, want none and 2", w, g.Keys())
	}
	var off Gate
	if off.KeyWait(t0, 7) != 0 || off.Keys() != 0 {
		t.Fatal("without KeyRateLimit no key waits")
	}
}

func TestGaveBackUncountsTheRestOfABatch(t *testing.T) {
	g := New(Config{Concurrency: 8})
	g.Took(5)
	g.GaveBack(4)
	g.Done(t0, t0, false)
	if g.Active() != 0 {
		t.Fatalf("active %d, want 0", g.Active())
	}
}

// FuzzGate drives a gate of every kind through takes, charges, ends and
// key reservations at moving times: Active is always the attempts taken
// less those ended or given back, never below 0; a gate that is not Gated
// allows any start; the breaker and the adaptive limit are never both on.
func FuzzGate(f *testing.F) {
	f.Add(uint8(4), uint8(0), uint8(0), []byte{0, 1, 2, 3, 4, 5})
	f.Add(uint8(2), uint8(1), uint8(3), []byte{1, 1, 9, 9, 17, 2, 2})
	f.Add(uint8(1), uint8(6), uint8(1), []byte{8, 24, 40, 56, 3, 3, 3})
	f.Fuzz(func(t *testing.T, conc, kind, burst uint8, ops []byte) {
		c := Config{Concurrency: int(conc%16) + 1, Adaptive: kind&1 != 0, KeyBuckets: 8}
		if kind&2 != 0 {
			c.Rate = Rate{PerSecond: 50, Burst: int(burst%4) + 1}
		}
		if kind&4 != 0 {
			c.KeyRate = Rate{PerSecond: 20, Burst: int(burst%3) + 1}
		}
		g := New(c)
		if g.Measures() && (g.Open() || g.Watching()) {
			t.Fatal("the adaptive limit and the breaker are both on")
		}
		now, want := t0, 0
		for _, op := range ops {
			now = now.Add(time.Duration(op>>3) * 7 * time.Millisecond)
			switch op & 7 {
			case 0, 1:
				if !g.Gated() {
					if ok, wait := g.Allow(now); !ok || wait != 0 {
						t.Fatalf("not gated, yet Allow says %v, %v", ok, wait)
					}
				}
				if ok, _ := g.Allow(now); ok {
					n := int(op&1) + 1
					g.Took(n)
					g.Charge(now, n)
					want += n
				}
			case 2, 3:
				if want > 0 {
					g.Done(now, now.Add(-time.Duration(op)*time.Millisecond), op&1 != 0)
					want--
				}
			case 4:
				if want > 1 {
					g.GaveBack(1)
					want--
				}
			case 5:
				if w := g.KeyWait(now, uint64(op>>3)); !g.Keyed() && w != 0 {
					t.Fatalf("no KeyRateLimit, yet key waits %v", w)
				}
			case 6:
				if lim, on := g.Limit(); on != g.Measures() || (on && (lim < 1 || lim > c.Concurrency)) {
					t.Fatalf("limit %d on %v with ceiling %d", lim, on, c.Concurrency)
				}
			case 7:
				if ok, wait := g.Allow(now); ok && wait != 0 {
					t.Fatalf("allowed with a wait %v", wait)
				}
			}
			if g.Active() != want {
				t.Fatalf("active %d, want %d", g.Active(), want)
			}
			if g.Keys() > c.KeyBuckets {
				t.Fatalf("%d key buckets, bound %d", g.Keys(), c.KeyBuckets)
			}
		}
	})
}
