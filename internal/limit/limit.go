// Package limit holds the adaptive concurrency limit of kpar's engine: how
// many handler attempts may run at once, between 1 and a ceiling, moved by
// what the downstream says.
//
// The rule is additive increase, multiplicative decrease (the congestion
// control of TCP): a start in slow start (the limit grows by one per success,
// doubling per round trip) until the first overload signal, then by 1/limit
// per success (one per round trip); an overload signal (the handler said so,
// an attempt timed out, or the recent latency rose past twice the long-run
// one) cuts
// the limit to 0.7 of itself, at most once per recent latency so that one
// wave of rejections counts once. At the floor, continued overload opens a
// pause before the next start, doubling up to MaxPause: an outage is probed,
// not hammered.
//
// Why not a library: failsafe-go's adaptivelimiter (v0.9.8) moves its limit
// from latency trends only, so an endpoint that answers 429 at once reads as
// fast and healthy; kpar's main signal is the explicit rejection.
//
// Adaptive is a pure data structure: no goroutines, no clock of its own; the
// caller passes the time and holds its lock.
package limit

import "time"

// MaxPause bounds the pause between probes of an overloaded downstream.
const MaxPause = 5 * time.Second

const (
	decrease    = 0.7
	minPause    = 10 * time.Millisecond
	slowLatency = 2 // recent latency above this many baselines is overload
)

// Adaptive is an adaptive concurrency limit. The zero value is not usable;
// use New.
type Adaptive struct {
	ceiling float64
	limit   float64
	slow    bool // slow start: no overload seen yet

	// Latency, smoothed fast (recent, 1/8 per sample) and slowly
	// (baseline, 1/64): recent pulling away from baseline means requests
	// queue at the downstream.
	recent, baseline time.Duration

	lastCut   time.Time
	pause     time.Duration // current pause at the floor, 0 when none
	notBefore time.Time     // no start before this while paused
}

// New returns a limit between 1 and ceiling, starting at min(ceiling, 4).
func New(ceiling int) *Adaptive {
	c := float64(max(ceiling, 1))
	return &Adaptive{ceiling: c, limit: min(c, 4), slow: true}
}

// Limit is the current limit.
func (a *Adaptive) Limit() int { return int(a.limit) }

// Allow reports whether one more attempt may start now with inflight
// attempts running. When it may not because of a pause, wait is how long
// until it may; when the limit is reached, wait is 0: the next completion
// frees a place.
func (a *Adaptive) Allow(now time.Time, inflight int) (ok bool, wait time.Duration) {
	if now.Before(a.notBefore) {
		return false, a.notBefore.Sub(now)
	}
	return inflight < int(a.limit), 0
}

// Done records an attempt that ran for latency; overloaded says the
// downstream pushed back (an explicit overload answer or a timeout).
func (a *Adaptive) Done(now time.Time, latency time.Duration, overloaded bool) {
	if !overloaded {
		if a.baseline == 0 {
			a.recent, a.baseline = latency, latency
		}
		a.recent = (7*a.recent + latency) / 8
		a.baseline = (63*a.baseline + latency) / 64
		if a.recent > slowLatency*a.baseline && a.recent > time.Millisecond {
			a.cut(now)
			return
		}
		a.pause, a.notBefore = 0, time.Time{}
		if a.slow {
			a.limit = min(a.limit+1, a.ceiling)
		} else {
			a.limit = min(a.limit+1/a.limit, a.ceiling)
		}
		return
	}
	a.slow = false
	if a.limit <= 1 {
		// At the floor and still overloaded: pause before the next probe.
		a.pause = min(max(2*a.pause, minPause), MaxPause)
		a.notBefore = now.Add(a.pause)
		return
	}
	a.cut(now)
}

// cut lowers the limit, once per recent latency: the attempts that were
// already running when the downstream pushed back say the same thing.
func (a *Adaptive) cut(now time.Time) {
	a.slow = false
	if now.Sub(a.lastCut) < max(a.recent, time.Millisecond) {
		return
	}
	a.lastCut = now
	a.limit = max(a.limit*decrease, 1)
}
