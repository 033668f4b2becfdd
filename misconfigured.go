package kpar

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Misconfigured marks err as the downstream refusing every attempt for a
// reason an operator must fix, not the record: a TLS certificate that
// stopped verifying (rotated to another CA, or an endpoint that came up
// with a bad one), credentials that no longer work. The record is held as
// for Overloaded, which IsOverloaded reports it as: the attempt does not
// count against MaxAttempts, nothing is dead-lettered for it, and
// dispatching slows down to probes (the breaker, or AdaptiveConcurrency).
// Unlike an overload, the log says so at ERROR level, with the error, when
// it begins and every 10s while it lasts, and once when attempts succeed
// again. Misconfigured(nil) returns nil.
func Misconfigured(err error) error {
	if err == nil {
		return nil
	}
	return &misconfiguredError{overloadedError{err}}
}

// IsMisconfigured reports whether err, or an error it wraps, was marked
// Misconfigured.
func IsMisconfigured(err error) bool {
	var m *misconfiguredError
	return errors.As(err, &m)
}

// misconfiguredError unwraps to an overloadedError: every path that holds
// an overloaded record holds it.
type misconfiguredError struct{ over overloadedError }

func (e *misconfiguredError) Error() string { return e.over.err.Error() }
func (e *misconfiguredError) Unwrap() error { return &e.over }

// misconfigReport is how often a misconfiguration spell is logged again,
// and how soon after one was logged a new one may be.
const misconfigReport = overloadReport

// misconfigLog logs the spells of Misconfigured failures of one Run, the
// way overloadLog does for overloads but at ERROR level, each line with
// the error (it names the endpoint and what to fix). A spell ends at the
// first success: a certificate fixed is fixed. A downstream that mixes
// them (a load balancer with one bad backend) begins and ends spells all
// the time; a spell that begins within misconfigReport of the last one
// logged is counted, not logged, and so is its end. Failures are observed
// outside engine.mu, so it has a lock of its own.
type misconfigLog struct {
	active atomic.Bool

	mu       sync.Mutex // guards the rest
	since    time.Time  // the spell's first failure
	reported time.Time  // the latest line; zero before the first
	logged   bool       // the spell's beginning was logged: so is its end
	recent   int        // failures since the latest line
	total    int        // failures of the spell
}

// failed logs a failed attempt marked Misconfigured to log: the spell's
// first in full, then one line every misconfigReport with the latest
// error. attrs describe the attempt.
func (m *misconfigLog) failed(log *slog.Logger, err error, attrs []any) {
	now := time.Now()
	m.mu.Lock()
	if !m.active.Load() {
		m.active.Store(true)
		m.since, m.recent, m.total = now, 0, 1
		m.logged = m.reported.IsZero() || now.Sub(m.reported) >= misconfigReport
		if !m.logged {
			m.mu.Unlock()
			return
		}
		m.reported = now
		m.mu.Unlock()
		log.Error("kpar: the downstream refuses every attempt for a configuration error; records are held "+
			"(no attempt counted, nothing dead-lettered) and probed until it is fixed; this repeats every 10s while it lasts",
			attrs...)
		return
	}
	m.recent++
	m.total++
	if now.Sub(m.reported) < misconfigReport {
		m.mu.Unlock()
		return
	}
	recent, since := m.recent, m.since
	m.reported, m.recent, m.logged = now, 0, true
	m.mu.Unlock()
	log.Error("kpar: the downstream still refuses every attempt for a configuration error; records are held",
		"for", now.Sub(since).Round(time.Millisecond), "failed_attempts", recent, "err", err)
}

// recovered ends a misconfiguration spell at a success, and logs its end
// to log if its beginning was logged.
func (m *misconfigLog) recovered(log *slog.Logger, now time.Time) {
	m.mu.Lock()
	if !m.active.Load() {
		m.mu.Unlock()
		return
	}
	m.active.Store(false)
	since, total, logged := m.since, m.total, m.logged
	m.mu.Unlock()
	if logged {
		log.Info("kpar: the downstream's configuration error is over: attempts succeed again",
			"refused_for", now.Sub(since).Round(time.Millisecond), "failed_attempts", total)
	}
}
