package kpar

import (
	"sync"
	"sync/atomic"
	"time"
)

// A downstream that is down or overloaded answers every attempt with an
// error marked Overloaded (kpar forward: 429, 503, refused connections).
// Three things keep such a spell from emptying the topic into the
// dead-letter sink and from flooding the downstream and the log:
//
//   - fail (failures.go) does not count the attempt against MaxAttempts;
//   - the adaptive limit, or without it the breaker (internal/limits),
//     slows dispatching down to probes with growing pauses;
//   - the failures are logged once when the spell begins, then summarised
//     every overloadReport, and its end is logged once.

// overloadReport is how often an overload spell is summarised in the log.
const overloadReport = 10 * time.Second

// overloadEnds is how long attempts must go without an overload signal,
// succeeding, for a spell to end: a downstream short of capacity mixes
// rejections with successes, and that is one long spell, not many short
// ones.
const overloadEnds = time.Second

// overloadLog summarises the overloaded failures of one Run. Failures are
// observed outside engine.mu, so it has a lock of its own.
type overloadLog struct {
	active  atomic.Bool  // a spell is on
	last    atomic.Int64 // UnixNano of its latest overloaded failure
	probing atomic.Bool  // the breaker is open: a success is a probe's, the end of an outage
	// succeeded: an attempt succeeded during the spell. A spell whose
	// successes stopped (the topic drained) before overloadEnds passed
	// ends when quiet fires; if Run stopped first, its next failure
	// begins a new one.
	succeeded atomic.Bool
	lastOK    atomic.Int64 // UnixNano of the spell's latest success

	mu       sync.Mutex // guards the rest
	since    time.Time  // the spell's first overloaded failure
	reported time.Time  // its latest summary (or beginning)
	recent   int        // overloaded failures since then
	total    int        // overloaded failures of the spell

	// quiet is armed by a success that came less than overloadEnds after
	// the latest failure: it ends the spell once the quiet has lasted,
	// for a topic that drained meanwhile (kpar forward --batch: one 503
	// item among 2xx ones, retried at once) sends no later success to.
	// Guarded by mu, like stopped (Run is returning: not armed again).
	quiet   *time.Timer
	stopped bool
}

// limitDone ends an attempt in the limits room (internal/limits) and gives
// its outcome to the adaptive limit, which measures every attempt, or to
// the overload breaker. now is when the attempt started: close enough for
// the breaker while nothing is overloaded, and free of a clock reading per
// record then. Once overload signals come, the breaker measures the quiet
// since the last success from when that success ended: on a starved
// machine a downstream short of capacity answers slowly, and that is not
// an outage. Called with mu held.
func (e *engine) limitDone(t *task, err error, timedOut bool, now time.Time) {
	over := err != nil && (timedOut || IsOverloaded(err)) // no errors.As per success
	breaker := !e.limits.Measures()
	if breaker {
		// A record suspected of hanging the downstream (hang.go) is not a
		// sign of its overload: its timeouts do not slow the others down
		// to probes, nor serialise the suspects behind one probe at a time.
		over = over && (t.Value.x == nil || !t.Value.x.hang.suspect)
	}
	if !breaker || over || e.limits.Watching() {
		now = time.Now()
	}
	if e.limits.Done(now, epoch.Add(t.Value.started), over) {
		if breaker {
			e.over.probing.Store(e.limits.Open())
		}
		e.wake(1) // room again, closed again, or a new pause: a worker re-reads the gate
	}
}

// overloaded logs a failed attempt whose error is marked Overloaded, the
// spell's first one in full and the rest in summaries, and reports whether
// err was such an error (else the caller logs it). attrs describe the
// attempt.
func (e *engine) overloaded(err error, attrs []any) bool {
	if !IsOverloaded(err) {
		return false
	}
	if IsMisconfigured(err) {
		e.misconfigured(err, attrs)
		return true
	}
	o := &e.over
	now := time.Now()
	prev := o.last.Swap(now.UnixNano())
	o.mu.Lock()
	if o.active.Load() && o.succeeded.Load() && now.UnixNano()-prev >= int64(overloadEnds) {
		o.active.Store(false) // see succeeded
	}
	if !o.active.Load() {
		o.active.Store(true)
		o.succeeded.Store(false)
		o.since, o.reported, o.recent, o.total = now, now, 0, 1
		o.mu.Unlock()
		e.log.Warn("kpar: downstream overloaded: an attempt failed with an error marked Overloaded; "+
			"such attempts burn no retry, dispatching slows down to probes, and further ones are summarised every 10s", attrs...)
		return true
	}
	o.recent++
	o.total++
	if now.Sub(o.reported) < overloadReport {
		o.mu.Unlock()
		return true
	}
	recent, since, in := o.recent, o.since, now.Sub(o.reported)
	o.reported, o.recent = now, 0
	o.mu.Unlock()
	e.log.Warn("kpar: downstream still overloaded",
		"for", now.Sub(since).Round(time.Millisecond), "failed_attempts", recent, "in", in.Round(time.Millisecond), "err", err)
	return true
}

// recovered ends an overload spell when an attempt succeeded overloadEnds
// after the latest overloaded failure, or succeeded while the breaker was
// open (a probe: the outage is over, however soon the backlog drains).
// Called for every success: it costs an atomic load unless a spell is on.
func (e *engine) recovered() {
	if e.misconf.active.Load() {
		e.misconfigRecovered(time.Now())
	}
	o := &e.over
	if !o.active.Load() {
		return
	}
	if !o.succeeded.Load() {
		o.succeeded.Store(true)
	}
	now := time.Now()
	o.lastOK.Store(now.UnixNano())
	if quiet := now.UnixNano() - o.last.Load(); !o.probing.Load() && quiet < int64(overloadEnds) {
		o.mu.Lock()
		if o.quiet == nil && o.active.Load() && !o.stopped {
			o.quiet = time.AfterFunc(overloadEnds-time.Duration(quiet), e.quietEnds)
		}
		o.mu.Unlock()
		return
	}
	e.endSpell(now)
}

// quietEnds ends the spell when its latest failure was followed by a
// success and then by overloadEnds without an overload signal; after a
// later failure it waits for that one's quiet, and with no success since
// (the record is waiting out its backoff) the next success re-arms it.
func (e *engine) quietEnds() {
	o := &e.over
	o.mu.Lock()
	o.quiet = nil
	now := time.Now()
	last := o.last.Load()
	if !o.active.Load() || o.stopped || o.lastOK.Load() < last {
		o.mu.Unlock()
		return
	}
	if wait := overloadEnds - time.Duration(now.UnixNano()-last); wait > 0 {
		o.quiet = time.AfterFunc(wait, e.quietEnds)
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	e.endSpell(now)
}

// endSpell logs the end of the spell, if one is on.
func (e *engine) endSpell(now time.Time) {
	o := &e.over
	o.mu.Lock()
	if !o.active.Load() {
		o.mu.Unlock()
		return
	}
	o.active.Store(false)
	since, total := o.since, o.total
	o.mu.Unlock()
	e.log.Info("kpar: downstream recovered: attempts succeed again",
		"overloaded_for", now.Sub(since).Round(time.Millisecond), "failed_attempts", total)
}

// stopQuiet disarms quiet for good: Run is returning.
func (o *overloadLog) stopQuiet() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stopped = true
	if o.quiet != nil {
		o.quiet.Stop()
		o.quiet = nil
	}
}
