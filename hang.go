package kpar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kpar/kpar/deadletter"
)

// A record that hangs the downstream. An attempt that times out is taken
// for the downstream's fault (kpar forward marks it Overloaded unless the
// endpoint answered another request meanwhile): it burns no attempt, so an
// endpoint that hangs every request dead-letters nothing. But a record
// that hangs an endpoint which answers every other record would then be
// held for ever once the other records are done, its key (or partition)
// and its commits with it (issue 35: 38 of 2,000 held, the commit stuck).
//
// The policy tells the two apart by what the other records saw:
//
//   - A record is suspected of hanging the endpoint when an attempt of it
//     timed out and another record succeeded after that attempt began, or
//     within AttemptTimeout before: the endpoint was answering others.
//     Any failure that is not a timeout clears the suspicion (the
//     endpoint answered this record, or refused it: it is down).
//   - The suspicion is strong once a record whose attempt began after the
//     suspect's hang began succeeded: the endpoint answered a request
//     while this one hung. It is weak while the only successes came
//     before, as for every record in flight when the endpoint stops
//     answering anything.
//   - A suspect is dead-lettered (class timeout, its message saying that
//     it hung the endpoint) once it has been held HangLimit (default 2m)
//     since its hang began or since the last record succeeded, whichever
//     came first: by then the rest of the traffic had stopped for
//     HangLimit or was flowing past it. It goes at the end of the last
//     attempt that could end within the bound, so it reaches the sink
//     within HangLimit of the last success.
//   - Unless the endpoint looks down, since the last success: a record
//     that is not a suspect failed as overloaded or timed out (a fresh
//     record refused, or hung with nothing answered around it), or
//     outageHangs (3) weak suspects hung at once (several records hang,
//     none answered since their hangs began: in partition order every
//     partition's head, in a share group the acquired batch, which are
//     all that kpar holds that can run). Then every record waits, as for
//     any outage, and a suspect whose attempt saw no answer starts its
//     streak again, so that the outage's end finds it within the bound.
//   - And unless it may be: nothing was answered during the suspect's
//     last attempt while records that are not suspects wait to run
//     (other keys, other partitions). The suspect then steps aside for
//     an attempt's time so that they are tried: if they hang too, the
//     endpoint is down (above); if nothing else waits, the rest of the
//     traffic has stopped, and the suspect goes.
//
// Why three weak suspects, not two: two records that hang often come due
// together. Suspects due at one watchdog tick are dead-lettered together,
// so the next hanging record of each of their keys (or partitions) starts
// after the same last success, and nothing answers between: with two,
// the conformance row hung-record held such a pair for ever in key order
// (4 of 6 runs of group-key and share-key). Both pictures are the same to
// kpar, so the count decides: one or two records hanging with nothing
// else to try are records that hang; three or more are an outage.
//
// A blackholed endpoint (every request hangs) thus dead-letters nothing
// while records that were never answered around it keep failing, or three
// records or more are in flight; a record whose every attempt hangs while
// others pass is dead-lettered, whether or not the others still come.
// Left: an outage met by one or two records that can run (one or two
// partitions, Concurrency below 3) dead-letters them after HangLimit, and
// three or more records that hang and come due together, with nothing
// answered around them, are held until another record succeeds. Starts
// are read at dispatch (a fast worker's chain of records shares one), so
// a record dispatched just before the last answer may count as answered
// over: the weak suspects may then fall short of three, and they go after
// HangLimit as before this count. Requests, which take milliseconds, are
// seldom answered out of the order they were sent in: this is mostly a
// matter of handlers that take microseconds.

// defaultHangLimit is HangLimit's default.
const defaultHangLimit = 2 * time.Minute

// HangLimit bounds how long a record whose attempts keep timing out is
// held while the downstream answers other records, overriding the default
// 2m: at the end of the last attempt that can end within it, the record
// goes to the dead-letter sink (class timeout, its message saying that it
// hung the downstream). The bound runs from when the record's attempts
// began to time out, or from the last success of any record when that came
// first. While the downstream looks down nothing is dead-lettered: records
// that are not suspected of hanging it fail too, or three or more records
// hang at once and none was answered since their hangs began (an outage
// that meets only the partitions' heads, or a share group's batch). Without
// a dead-letter sink the record keeps being retried. 0 turns the bound
// off: such a record is held until it succeeds.
func HangLimit(d time.Duration) FlowOpt { return flowOpt(func(c *cfg) { c.hangLimit = d }) }

// hangState is a record's timed-out streak (extra.hang). Set under mu.
type hangState struct {
	since   time.Time // start of the streak's first attempt; zero for none
	suspect bool      // another record succeeded around one of the streak's attempts
	// answeredOver: a record whose attempt began after the streak began
	// succeeded (the suspicion is strong; without it, weak).
	answeredOver bool
}

// hangWatch is what the engine saw of successes and of failures that say
// the downstream is down, for the hang policy. Guarded by engine.mu.
type hangWatch struct {
	exiledDone int64     // finished records that were exiled, not handled
	succeeded  int64     // handled records at the last sample
	answered   time.Time // when the watchdog last saw one more handled record
	downAt     time.Time // the latest failure that says the downstream is down
	// lastStart is the start (since epoch) of the latest-starting
	// attempt that succeeded, once one did (started): a suspect whose hang
	// began before it was answered over. A run's records count from the
	// run's start.
	lastStart time.Duration
	started   bool
	// weak holds the weak suspects seen lately, each with when its
	// entry lapses (the end of its next attempt, if it keeps hanging).
	weak map[*extra]time.Time
}

// outageHangs is how many distinct weak suspects hanging at once make
// an outage (see the policy above).
const outageHangs = 3

// answer notes a successful attempt that began at started (since
// epoch; a compare per success, no clock reading). Called with mu held,
// by finish.
func (h *hangWatch) answer(started time.Duration) {
	if started > h.lastStart || !h.started {
		h.lastStart, h.started = started, true
	}
}

// answeredOver reports whether a record whose attempt began after x's
// streak began succeeded, and remembers it in x.
func (h *hangWatch) answeredOver(x *extra) bool {
	if !x.hang.answeredOver && h.started && !x.hang.since.IsZero() && h.lastStart > x.hang.since.Sub(epoch) {
		x.hang.answeredOver = true
	}
	return x.hang.answeredOver
}

// weakOutage notes weak suspect x, hanging again at now and due to hang
// again by until, and reports whether outageHangs distinct weak suspects
// hang at once: those whose entries have not lapsed, are still suspects
// in a streak and were not answered over since.
func (h *hangWatch) weakOutage(x *extra, now, until time.Time) bool {
	if h.weak == nil {
		h.weak = make(map[*extra]time.Time)
	}
	h.weak[x] = until
	for y, by := range h.weak {
		if now.After(by) || !y.hang.suspect || y.hung || h.answeredOver(y) {
			delete(h.weak, y)
		}
	}
	return len(h.weak) >= outageHangs
}

// sampleAnswers notes when records were last handled successfully: at
// every watchdog tick, from finished, the count of finished records, less
// those that were exiled (no clock reading per record). Called with mu
// held.
func (h *hangWatch) sampleAnswers(finished int64, now time.Time) {
	if n := finished - h.exiledDone; n != h.succeeded {
		h.succeeded, h.answered = n, now
	}
}

// timeoutErr reports whether err is a timeout: a context's deadline, or an
// error that says it timed out (a net.Error).
func timeoutErr(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &t) && t.Timeout())
}

// hung applies the hang policy to a failed attempt of it, and reports
// whether the record is to be dead-lettered now as having hung the
// downstream (its lastErr then says so), or else how long at least it is
// to wait before its next attempt. Called with mu held, by fail.
func (e *engine) hung(it *item, x *extra, err error, timedOut bool, backoff time.Duration) (dead bool, wait time.Duration) {
	if !timedOut && !timeoutErr(err) {
		x.hang = hangState{}
		if IsOverloaded(err) {
			e.hangs.downAt = time.Now()
		}
		return false, 0
	}
	now := time.Now()
	start := epoch.Add(it.started)
	if x.hang.since.IsZero() {
		x.hang.since = start
	}
	answered := e.hangs.answered
	if !answered.IsZero() && !answered.Before(start.Add(-e.cfg.attemptTimeout)) {
		x.hang.suspect = true
	}
	if !x.hang.suspect {
		e.hangs.downAt = now
		return false, 0
	}
	if e.cfg.hangLimit <= 0 || e.cfg.deadLetters == nil || x.class == deadletter.ClassPermanent {
		return false, 0
	}
	if !e.hangs.answeredOver(x) && e.hangs.weakOutage(x, now, now.Add(backoff+2*e.cfg.attemptTimeout)) {
		e.hangs.downAt = now // several records hang, none answered since: an outage
	}
	if e.hangs.downAt.After(answered) {
		// The downstream looks down: others fail too. An attempt during
		// which nothing was answered then says nothing of this record:
		// its streak starts again, so that it is not dead-lettered at
		// the outage's end for having hung through it.
		if !answered.After(start) {
			x.hang = hangState{}
		}
		return false, 0
	}
	from := x.hang.since
	if answered.Before(from) {
		from = answered
	}
	// Dead-letter now when the next attempt could not end within the bound.
	if now.Add(backoff + e.cfg.attemptTimeout).Before(from.Add(e.cfg.hangLimit)) {
		return false, 0
	}
	if !answered.After(start) && e.ready.Any(func(t *task) bool { return t.Value.x == nil || !t.Value.x.hang.suspect }) {
		// Nothing was answered during this attempt, and other records
		// could run (other keys, other partitions) and wait: the rest
		// of the traffic has not stopped, it is held up. Step aside for
		// an attempt's time so that they are tried: if they hang too,
		// the downstream is down (downAt).
		return false, e.cfg.attemptTimeout
	}
	x.lastErr = fmt.Errorf("kpar: the record hung the downstream: its attempts timed out for %v while the downstream answered other records (HangLimit %v); dead-lettered so that its key and its partition's commits go on: %w",
		now.Sub(x.hang.since).Round(time.Second), e.cfg.hangLimit, err)
	x.class, x.hung = deadletter.ClassTimeout, true
	return true, 0
}
