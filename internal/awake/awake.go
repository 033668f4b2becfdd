// Package awake is the bookkeeping of kpar's workers' wakefulness: the
// workers asleep, the wake-up on its way, the awake cap and the stuck
// guard.
//
// Wake wakes one worker, and only when no other wake-up is still on its
// way (Woken clears it when the woken worker runs): a woken worker that
// leaves ready records behind wakes the next once it runs. So at most one
// worker is runnable without having run, and the ramp goes as fast as
// woken workers get a CPU. Without that rule every finish and take
// signalled another sleeper before the last one ran: an execution trace
// of kpar bench noop found some 25 workers runnable on average, on two
// cores.
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
// Invariants: at most one wake-up is on its way; Wake signals only with a
// worker asleep and the cap allowing one more; Excess counts the stuck
// workers of the last tick as asleep;
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

// Cap is the workers' wakefulness, the awake cap's and the stuck guard's
// state.
type Cap struct {
	idle   int    // workers asleep that no wake-up is on its way to
	waking bool   // a wake-up is on its way, until the woken worker runs
	limit  int    // GOMAXPROCS, when cheap
	stuck  int    // workers running one record since the tick before last, at the last tick
	held   int    // wake-ups the cap held back and workers it put to sleep, for tests
	tick   uint32 // ticks so far
}

// New returns a cap of limit awake workers.
func New(limit int) Cap { return Cap{limit: max(limit, 1)} }

// Excess is how many awake workers of workers are beyond the cap: 0 when
// it allows no more, below 0 when it has room (always, while the handler
// is not cheap).
func (c *Cap) Excess(cheap bool, workers int) int {
	if !cheap {
		return math.MinInt
	}
	return workers - c.idle - (c.limit + c.stuck)
}

// Wakeup is what Wake decided.
type Wakeup int

const (
	None   Wakeup = iota // no wake-up: none needed, none possible, or one on its way
	Signal               // wake one sleeper
	Held                 // the cap held a wake-up back: arm the stuck guard
)

// Wake decides the wake-up for n records that became ready, with workers
// in all and the handler cheap or not.
func (c *Cap) Wake(n int, cheap bool, workers int) Wakeup {
	if n <= 0 || c.idle == 0 || c.waking {
		return None
	}
	if c.Excess(cheap, workers) >= 0 {
		c.held++
		return Held
	}
	c.idle--
	c.waking = true
	return Signal
}

// Sleep counts a worker going to sleep.
func (c *Cap) Sleep() { c.idle++ }

// Woken notes that a woken worker runs: the next wake-up may go.
func (c *Cap) Woken() { c.waking = false }

// WakeAll notes that every sleeper is woken (at shutdown).
func (c *Cap) WakeAll() { c.idle, c.waking = 0, false }

// Idle is the workers asleep that no wake-up is on its way to.
func (c *Cap) Idle() int { return c.idle }

// Hold notes a worker the cap put to sleep with records ready: the caller
// arms the guard if it is not.
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
