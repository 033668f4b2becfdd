package kpar

import (
	"errors"
	"fmt"
	"time"
)

// ErrRunning is returned by Run when the Consumer is already running: a
// Consumer owns one group member and its state, so it runs once at a time.
var ErrRunning = errors.New("kpar: Consumer is already running; call Run once per Consumer, or create another Consumer to add a group member")

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("kpar: Consumer is closed; create a new one to consume again")

// ErrShutdownTimeout is returned by Run when ShutdownTimeout passed with
// records unfinished. Their handlers' contexts were cancelled; the records
// were not committed and will be delivered again (the finished records
// above them were, in the commit metadata). A handler that ignores its
// context keeps its goroutine until it returns; Run does not wait for it.
var ErrShutdownTimeout = errors.New("kpar: shutdown timeout passed with records unfinished; they were not committed and will be delivered again")

// ErrFinalCommit is returned by Run when its last commit at shutdown (a
// share group's last acknowledgements) failed, with the failure wrapped:
// nothing is lost, but the records finished since the last commit that
// landed will be delivered again. In the classic group protocol it happens
// when Run stops during a rebalance that waits for a crashed member longer
// than ShutdownTimeout (its session timeout, 45s by default).
var ErrFinalCommit = errors.New("kpar: the final commit failed; the records finished since the last commit that landed will be delivered again")

// ErrOrderingMismatch is returned by Run when the group's other members use
// another ordering mode, or are not kpar consumers: members that order
// differently would break per-key (or per-partition) order on the
// partitions they get. Use one Ordering for every member of a group; to
// change it, stop every member first (a rolling restart is refused while
// members of the old mode remain, crashed ones until their session times
// out).
var ErrOrderingMismatch = errors.New("kpar: the group's members use another ordering mode (or are not kpar consumers): use one ordering for every member of a group")

// ErrProducerFenced is returned by Run with ExactlyOnce when the member's
// transactional producer was fenced again and again with no transaction
// committed in between: another producer runs with its transactional ID.
// A fenced producer is replaced (a broker restart that aborted its open
// transaction fences it once); a member whose group refuses its commits
// while another producer keeps fencing it gives up. Give every member its
// own transactional ID (TransactionalID or InstanceID), and stop the
// member that was replaced.
var ErrProducerFenced = errors.New("kpar: the transactional producer keeps being fenced: another producer runs with this member's transactional ID; give every member its own (TransactionalID or InstanceID)")

// Overloaded marks err as the downstream pushing back (an HTTP 429 or 503,
// a connection refused, a full queue). The attempt does not count against
// MaxAttempts: the record waits until the downstream takes it, it is not
// dead-lettered for the downstream's overload (a record that is itself the
// problem must fail otherwise, or it waits forever). With
// AdaptiveConcurrency it lowers the in-flight limit; without it, once such
// failures come for 250ms without a success, a circuit breaker pauses
// dispatching (100ms doubling to 5s) and then lets one probe at a time
// through until one succeeds. Either way the log says so once, summarises
// every 10s, and says when attempts succeed again.
// Overloaded(nil) returns nil.
func Overloaded(err error) error {
	if err == nil {
		return nil
	}
	return &overloadedError{err}
}

// IsOverloaded reports whether err, or an error it wraps, was marked
// Overloaded.
func IsOverloaded(err error) bool {
	var o *overloadedError
	return errors.As(err, &o)
}

type overloadedError struct{ err error }

func (e *overloadedError) Error() string { return e.err.Error() }
func (e *overloadedError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying: the record goes straight to the
// failure path (the dead-letter sink, once configured) without further
// attempts. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err, or an error it wraps, came from Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// PanicError is the error of an attempt whose handler panicked. The attempt
// counts as failed and is retried like any other failure.
type PanicError struct {
	Value any    // what the handler passed to panic
	Stack []byte // the panicking goroutine's stack
}

func (e *PanicError) Error() string { return fmt.Sprintf("kpar: handler panic: %v", e.Value) }

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// RetryAfter marks err as retryable no sooner than d from now, overriding
// the computed backoff for that attempt (an HTTP 429 or 503 with a
// Retry-After header, say). RetryAfter(nil, d) returns nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, after: d}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// retryAfter returns the delay RetryAfter attached to err, if any.
func retryAfter(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.after, true
	}
	return 0, false
}
