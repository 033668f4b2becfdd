// Package awake is the bookkeeping of kpar's awake cap and stuck guard.
//
// While the handler is cheap (package cost), at most GOMAXPROCS workers
// are awake: more cannot run at once, and every extra one only queues at
// the pipeline's lock. In kpar bench noop all 64 default workers stayed
// awake, since each that takes a record while others are ready wakes the
// next, and in key mode goroutines spent 40-340 ms blocked on the lock in
// a run of about 350 ms; with the cap, 1-50 ms, and the process's CPU per
// record fell by 25-40 ns (BENCHMARKS.md, eighth pass).
//
// A worker in a handler still counts as awake, so a cheap handler that
// blocks now and then (a slow call, a lock) must not leave records waiting
// while the awake workers are all stuck in it. The stuck guard sees to
// that: while the cap holds back a wake-up it ticks every Tick, and each
// tick counts the workers that have been running one record since the
// tick before last (Stuck). The cap does not count those, so a record
// waits behind stuck handlers two ticks at most before an idle worker
// takes it.
//
// Invariants: Excess counts the stuck workers of the last tick as asleep;
// a record stamped at tick t is stuck from tick t+2 on, whatever the
// ticks' wrap-around. Cap is pure: no goroutines, no clock (the caller's
// timer calls Tick), no lock (the caller holds its own).
package awake

import (
	"math"
	"time"
)

// Tick is the stuck guard's period.
const Tick = time.Millisecond

// Cap is the awake cap's and the stuck guard's state.
type Cap struct {
	limit int    // GOMAXPROCS, when cheap
	stuck int    // workers running one record since the tick before last, at the last tick
	held  int    // wake-ups the cap held back and workers it put to sleep, for tests
	tick  uint32 // ticks so far
}

// New returns a cap of limit awake workers.
func New(limit int) Cap { return Cap{limit: max(limit, 1)} }

// Excess is how many of awake workers are beyond the cap: 0 when it
// allows no more, below 0 when it has room (always, while the handler is
// not cheap).
func (c *Cap) Excess(cheap bool, awake int) int {
	if !cheap {
		return math.MinInt
	}
	return awake - (c.limit + c.stuck)
}

// Hold notes a wake-up the cap held back, or a worker it put to sleep
// with records ready: the caller arms the guard if it is not.
func (c *Cap) Hold() { c.held++ }

// Held counts the wake-ups held back, for tests.
func (c *Cap) Held() int { return c.held }

// BeginTick starts a tick of the guard: its stuck count starts over.
func (c *Cap) BeginTick() {
	c.tick++
	c.stuck = 0
}

// Stamp is the tick to note when a worker takes a record, for Stuck.
func (c *Cap) Stamp() uint32 { return c.tick }

// Stuck reports whether a record taken at stamp has run since the tick
// before last, and counts it as stuck if so. Called for each running
// record after BeginTick.
func (c *Cap) Stuck(stamp uint32) bool {
	if c.tick-stamp < 2 {
		return false
	}
	c.stuck++
	return true
}

// StuckCount is the stuck workers counted at the last tick.
func (c *Cap) StuckCount() int { return c.stuck }
