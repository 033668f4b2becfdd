// Package limits is the room of kpar's engine that decides whether a
// handler attempt may start now: the attempts running, and the gates they
// pass, composed from package limit (the adaptive in-flight limit, or
// without it the overload breaker) and package throttle (RateLimit's
// bucket, KeyRateLimit's table of buckets).
//
// A worker asks Allow before it takes a record, counts what it took with
// Took (and, under RateLimit, pays for it with Charge), and every attempt
// Took counted ends with Done, which gives its outcome to the adaptive
// limit or the breaker. A record whose key is out of tokens reserves its
// key's next token (KeyWait) and is set aside by the engine until that
// token is due, so the records of a hot key get distinct due times
// instead of all waking at once, and no worker waits for one.
//
// The engine's fast paths must not read the clock per record: Gated says
// whether Allow needs the time at all (false with a closed breaker and no
// RateLimit, the common case), Paced whether Charge is due, and Measures
// and Watching whether Done needs the attempt's end.
//
// Invariants: Active is the attempts Took counted less those Done ended
// and GaveBack returned, never below 0; at most one of the adaptive limit
// and the breaker is on (the adaptive limit paces an overloaded downstream
// itself); Allow lets no attempt start while the breaker is open and a
// probe runs or its pause lasts, while RateLimit's bucket is empty, or
// while the adaptive limit is reached or paused; Gated is false only when
// Allow would say yes whatever the time. Gate is pure: no goroutines, no
// lock (the engine's mu guards it), no clock (the caller passes the time,
// and arms the wake-up for the wait Allow returns).
package limits

import (
	"time"

	"github.com/kpar/kpar/internal/limit"
	"github.com/kpar/kpar/internal/throttle"
)

// Rate is a rate limit: PerSecond starts a second, in bursts of Burst.
// The zero Rate is no limit.
type Rate struct {
	PerSecond float64
	Burst     int
}

// Config is what New builds a Gate from.
type Config struct {
	// Concurrency is the workers' number, the adaptive limit's ceiling.
	Concurrency int
	// Adaptive turns the adaptive limit on, and the breaker off.
	Adaptive bool
	// Rate is RateLimit's, for every start; KeyRate is KeyRateLimit's,
	// for the starts of each key, kept in at most KeyBuckets buckets.
	Rate, KeyRate Rate
	KeyBuckets    int
}

// Gate is the limits' state. The zero value has no limit and no breaker;
// use New.
type Gate struct {
	active int             // attempts taken by workers and not done
	lim    *limit.Adaptive // nil unless Adaptive
	brk    *limit.Breaker  // nil with the adaptive limit
	global *throttle.Bucket
	keys   *throttle.Keys
}

// New returns the gate of c: every bucket full, the breaker closed.
func New(c Config) Gate {
	var g Gate
	if c.Adaptive {
		g.lim = limit.New(c.Concurrency)
	} else {
		g.brk = new(limit.Breaker)
	}
	if c.Rate.PerSecond > 0 {
		b := throttle.NewBucket(c.Rate.PerSecond, c.Rate.Burst)
		g.global = &b
	}
	if c.KeyRate.PerSecond > 0 {
		g.keys = throttle.NewKeys(c.KeyRate.PerSecond, c.KeyRate.Burst, c.KeyBuckets)
	}
	return g
}

// Gated reports whether some gate may hold an attempt back now: only then
// need Allow be asked, and the clock read for it.
func (g *Gate) Gated() bool {
	return g.lim != nil || g.global != nil || (g.brk != nil && g.brk.Open())
}

// Allow reports whether one more attempt may start now, and when it may
// not, how long until it may (0 when a running attempt's end decides: the
// adaptive limit is reached, or the breaker's probe runs). It takes
// nothing; Took and Charge count the start.
func (g *Gate) Allow(now time.Time) (ok bool, wait time.Duration) {
	if g.brk != nil && g.brk.Open() {
		if ok, wait = g.brk.Allow(now, g.active); !ok {
			return false, wait
		}
	}
	if g.global != nil {
		if ok, wait = g.global.Ready(now); !ok {
			return false, wait
		}
	}
	if g.lim != nil {
		return g.lim.Allow(now, g.active)
	}
	return true, 0
}

// Took counts n attempts starting.
func (g *Gate) Took(n int) { g.active += n }

// GaveBack uncounts n attempts that Took counted and that do not run
// after all (the rest of a failed batch, given back to its lane).
func (g *Gate) GaveBack(n int) { g.active = max(g.active-n, 0) }

// Paced reports whether RateLimit is on: starts must then be paid for
// with Charge.
func (g *Gate) Paced() bool { return g.global != nil }

// Charge takes n starts' tokens from RateLimit's bucket at now.
func (g *Gate) Charge(now time.Time, n int) {
	if g.global != nil && n > 0 {
		g.global.Take(now, n)
	}
}

// Keyed reports whether KeyRateLimit is on: records need their key's
// hash, and KeyWait.
func (g *Gate) Keyed() bool { return g.keys != nil }

// Rated reports whether a rate limit is on: the records a worker takes
// are paced, so it takes them one by one (no record runs, no wide lanes).
func (g *Gate) Rated() bool { return g.global != nil || g.keys != nil }

// KeyWait reserves the next token of the key hashed to key at now and
// returns how long until it is due: 0 or less when the start may happen
// now. Without KeyRateLimit it is always 0.
func (g *Gate) KeyWait(now time.Time, key uint64) time.Duration {
	if g.keys == nil {
		return 0
	}
	return g.keys.Reserve(now, key)
}

// Keys is how many keys have a bucket now.
func (g *Gate) Keys() int {
	if g.keys == nil {
		return 0
	}
	return g.keys.Len()
}

// Measures reports whether Done needs every attempt's end time: the
// adaptive limit measures each attempt's latency.
func (g *Gate) Measures() bool { return g.lim != nil }

// Watching reports whether the breaker saw an overload signal since the
// last success: only then does a success's end time matter to Done.
func (g *Gate) Watching() bool { return g.brk != nil && g.brk.Watching() }

// Open reports whether the breaker is open or half-open: a success then
// is a probe's, the end of an outage.
func (g *Gate) Open() bool { return g.brk != nil && g.brk.Open() }

// Done counts the end of an attempt that Took counted and gives its
// outcome to the adaptive limit or the breaker, whichever is on. now is
// when it ended and started when it started; overloaded says the
// downstream pushed back (an answer marked overloaded, or a timeout).
// With the breaker, a success's now may be its start while Watching is
// false, sparing a clock reading. Done reports whether a worker should ask
// Allow again: the adaptive limit may have room, or the breaker closed or
// paused anew.
func (g *Gate) Done(now, started time.Time, overloaded bool) (wake bool) {
	g.active = max(g.active-1, 0)
	if g.lim != nil {
		g.lim.Done(now, now.Sub(started), overloaded)
		return true
	}
	return g.brk != nil && g.brk.Done(now, started, overloaded)
}

// Active is how many attempts run now: taken and not done.
func (g *Gate) Active() int { return g.active }

// Limit is the adaptive limit now, and whether it is on.
func (g *Gate) Limit() (int, bool) {
	if g.lim == nil {
		return 0, false
	}
	return g.lim.Limit(), true
}
