package awake

import (
	"math"
	"testing"
)

func TestNotCheapHasRoomAlways(t *testing.T) {
	c := New(2)
	if got := c.Excess(false, 100); got != math.MinInt {
		t.Fatalf("not cheap, 100 awake: excess %d, want no cap", got)
	}
	if got := c.Excess(true, 3); got != 1 {
		t.Fatalf("cheap, 3 awake of 2: excess %d, want 1", got)
	}
	c.Sleep()
	if got := c.Excess(true, 3); got != 0 {
		t.Fatalf("cheap, 2 awake of 2: excess %d, want 0", got)
	}
}

func TestStuckWorkersDoNotCountAgainstTheCap(t *testing.T) {
	c := New(2)
	a, b := c.Stamp(), c.Stamp() // two workers take a record at tick 0
	c.BeginTick()
	if c.Stuck(a) || c.Stuck(b) || c.Excess(true, 2) != 0 {
		t.Fatalf("after one tick: stuck %d, excess %d; want none stuck and the cap full", c.StuckCount(), c.Excess(true, 2))
	}
	c.BeginTick()
	if !c.Stuck(a) || !c.Stuck(b) || c.Excess(true, 2) != -2 {
		t.Fatalf("after two ticks: stuck %d, excess %d; want both stuck and room for two", c.StuckCount(), c.Excess(true, 2))
	}
	fresh := c.Stamp()
	c.BeginTick()
	if c.Stuck(fresh) || c.StuckCount() != 0 {
		t.Fatal("a record taken at the last tick counts as stuck")
	}
}

func TestHoldCounts(t *testing.T) {
	c := New(0) // at least one worker stays awake
	c.Hold()
	c.Hold()
	if c.Held() != 2 || c.Excess(true, 1) != 0 {
		t.Fatalf("held %d, excess %d", c.Held(), c.Excess(true, 1))
	}
}

// FuzzStuck: whatever the ticks and stamps, a record is stuck exactly when
// two ticks or more began since its stamp, the count is that of the last
// tick, and the stuck workers leave room under the cap.
func FuzzStuck(f *testing.F) {
	f.Add(uint8(3), []byte{0, 1, 2, 0, 5})
	f.Add(uint8(1), []byte{255, 255})
	f.Fuzz(func(t *testing.T, limit uint8, steps []byte) {
		c := New(int(limit))
		c.tick = math.MaxUint32 - 3 // wrap around within the run
		var stamps []uint32
		var ticks []int // ticks begun since each stamp
		for _, s := range steps {
			if s%3 == 0 {
				stamps, ticks = append(stamps, c.Stamp()), append(ticks, 0)
				continue
			}
			c.BeginTick()
			want := 0
			for i := range stamps {
				ticks[i]++
				if got := c.Stuck(stamps[i]); got != (ticks[i] >= 2) {
					t.Fatalf("stamp %d after %d ticks: stuck %v", stamps[i], ticks[i], got)
				}
				if ticks[i] >= 2 {
					want++
				}
			}
			if c.StuckCount() != want {
				t.Fatalf("stuck %d, want %d", c.StuckCount(), want)
			}
			awake := len(stamps)
			if c.Excess(true, awake) != awake-c.limit-want {
				t.Fatalf("excess %d with %d awake, %d stuck, limit %d", c.Excess(true, awake), awake, want, c.limit)
			}
		}
	})
}
