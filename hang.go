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
//   - A suspect is dead-lettered (class timeout, its message saying that
//     it hung the endpoint) once it has been held HangLimit (default 2m)
//     since its hang began or since the last record succeeded, whichever
//     came first: by then the rest of the traffic had stopped for
//     HangLimit or was flowing past it. It goes at the end of the last
//     attempt that could end within the bound, so it reaches the sink
//     within HangLimit of the last success.
//   - Unless the endpoint looks down: a record that is not a suspect
//     failed as overloaded or timed out since the last success (a fresh
//     record refused, or hung with nothing answered around it). Then
//     every record waits, as for any outage.
//   - And unless it may be: nothing was answered during the suspect's
//     last attempt while records that are not suspects wait to run
//     (other keys, other partitions). The suspect then steps aside for
//     an attempt's time so that they are tried: if they hang too, the
//     endpoint is down (above); if nothing else waits, the rest of the
//     traffic has stopped, and the suspect goes.
//
// A blackholed endpoint (every request hangs) thus dead-letters nothing
// while records that were never answered around it keep failing; a record
// whose every attempt hangs while others pass is dead-lettered, whether or
// not the others still come.

// defaultHangLimit is HangLimit's default.
const defaultHangLimit = 2 * time.Minute

// HangLimit bounds how long a record whose attempts keep timing out is
// held while the downstream answers other records, overriding the default
// 2m: at the end of the last attempt that can end within it, the record
// goes to the dead-letter sink (class timeout, its message saying that it
// hung the downstream). The bound runs from when the record's attempts
// began to time out, or from the last success of any record when that came
// first; while records that are not suspected of hanging it fail too, the
// downstream is down and nothing is dead-lettered. Without a dead-letter
// sink the record keeps being retried. 0 turns the bound off: such a
// record is held until it succeeds.
func HangLimit(d time.Duration) FlowOpt { return flowOpt(func(c *cfg) { c.hangLimit = d }) }

// hangState is a record's timed-out streak (extra.hang). Set under mu.
type hangState struct {
	since   time.Time // start of the streak's first attempt; zero for none
	suspect bool      // another record succeeded around one of the streak's attempts
}

// hangWatch is what the engine saw of successes and of failures that say
// the downstream is down, for the hang policy. Guarded by engine.mu.
type hangWatch struct {
	exiledDone int64     // finished records that were exiled, not handled
	succeeded  int64     // handled records at the last sample
	answered   time.Time // when the watchdog last saw one more handled record
	downAt     time.Time // the latest overload or timeout of a record not suspected
}

// sampleAnswers notes when records were last handled successfully: at
// every watchdog tick, from the count of finished records that were not
// exiled (no clock reading per record).
func (e *engine) sampleAnswers(now time.Time) {
	e.mu.Lock()
	finished, _, _ := e.outcomes.Tally()
	if n := finished - e.hangs.exiledDone; n != e.hangs.succeeded {
		e.hangs.succeeded, e.hangs.answered = n, now
	}
	e.mu.Unlock()
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
	if e.hangs.downAt.After(answered) {
		return false, 0 // the downstream looks down: others fail too
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
