package limit

import "time"

// Breaker stops a fixed concurrency from hammering a downstream that is
// down: the circuit breaker kpar runs when the adaptive limit is off.
//
// Closed, it lets every start through. It opens when an overload signal
// comes after Quiet without a success (an outage answers nothing but
// overload; a downstream short of capacity keeps serving some, and is the
// adaptive limit's job), and stays open for a pause, 100ms doubling up to
// MaxPause while the probes fail. After the pause it is half-open: one
// attempt at a time, a probe. A success closes it; the probe's overload
// signal opens it again for the doubled pause. Signals from attempts that
// started before it opened say nothing new and are ignored.
//
// A 30 s outage thus sees some Quiet of full-rate attempts, then about a
// dozen probes, and kpar resumes within MaxPause of the recovery.
//
// Breaker is a pure data structure: no goroutines, no clock of its own;
// the caller passes the time and holds its lock. The zero value is a
// closed breaker.
type Breaker struct {
	lastSuccess time.Time // zero before the first outcome: then the first signal starts the count
	signalled   bool      // an overload signal came since the last success
	open        bool
	openedAt    time.Time
	pause       time.Duration
	notBefore   time.Time
}

// Quiet is how long overload signals must come without a success before
// the breaker opens.
const Quiet = 250 * time.Millisecond

const firstPause = 100 * time.Millisecond

// Open reports whether the breaker is open or half-open.
func (b *Breaker) Open() bool { return b.open }

// Watching reports whether an overload signal came since the last success:
// only then does a success's time matter, and the caller need read the
// clock for it.
func (b *Breaker) Watching() bool { return b.signalled }

// Allow reports whether one more attempt may start now with inflight
// attempts running, and when it may not because of the pause, how long
// until it may (0 when a probe is running: its outcome decides).
func (b *Breaker) Allow(now time.Time, inflight int) (ok bool, wait time.Duration) {
	switch {
	case !b.open:
		return true, 0
	case now.Before(b.notBefore):
		return false, b.notBefore.Sub(now)
	}
	return inflight == 0, 0
}

// Done records the outcome of an attempt that started at started (read
// only when overloaded); overloaded says the downstream pushed back (an
// explicit overload answer or a timeout). It reports whether the breaker
// changed state.
func (b *Breaker) Done(now, started time.Time, overloaded bool) (changed bool) {
	if !overloaded {
		b.lastSuccess, b.signalled = now, false
		if b.open {
			b.open, b.pause, b.notBefore = false, 0, time.Time{}
			return true
		}
		return false
	}
	b.signalled = true
	if b.lastSuccess.IsZero() {
		b.lastSuccess = now // count the quiet from the first signal
	}
	switch {
	case b.open && started.Before(b.openedAt):
		return false // running when it opened: old news
	case b.open:
		b.pause = min(2*b.pause, MaxPause) // the probe failed
	case now.Sub(b.lastSuccess) < Quiet:
		return false
	default:
		b.open, b.pause = true, firstPause
	}
	b.openedAt, b.notBefore = now, now.Add(b.pause)
	return true
}
