package kpar

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrAttemptTimeout is the cause (context.Cause) of a handler's context
// cancelled because the attempt ran past AttemptTimeout; the context's Err
// is then context.DeadlineExceeded, which it wraps. A context cancelled
// because the shutdown timeout passed has ErrShutdownTimeout as its cause,
// and context.Canceled as its Err. A handler that derives contexts from its
// own sees the same causes there.
var ErrAttemptTimeout = fmt.Errorf("kpar: attempt ran past AttemptTimeout: %w", context.DeadlineExceeded)

// Contexts that answer context.Cause for a cancelled attempt: cancelled
// with their cause, and carrying no value, so that attemptCtx.Value finds in
// them only the context package's own key for the nearest canceller.
var (
	timeoutCause  = cancelledWith(ErrAttemptTimeout)
	shutdownCause = cancelledWith(ErrShutdownTimeout)
)

func cancelledWith(cause error) context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	return ctx
}

// closedDone is a closed channel shared by attempts cancelled before anyone
// asked for Done.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// attemptCtx is the context of one handler attempt. context.WithDeadline
// would cost a timer per record; instead a watchdog goroutine scans the
// running attempts and cancels the overdue ones, and the Done channel is
// only made when a handler asks for it. Values and the parent's
// cancellation come from the embedded parent.
//
// It implements the context package's afterFuncer interface (AfterFunc):
// a context derived from it (context.WithTimeout(ctx, ...) in a handler,
// or context.AfterFunc) registers its cancellation here instead of
// starting a goroutine that waits on Done, which is what the context
// package does for a parent that is not one of its own types.
type attemptCtx struct {
	context.Context // parent: Values; its cancellation is relayed by the watchdog
	deadline        time.Time
	task            *task // the attempt's (first) record, for reports
	attempt         int   // task's attempt number, for reports
	emit            bool  // handlers may Emit outputs (outputs.go)

	mu   sync.Mutex
	done chan struct{}
	err  error
	// canceled is set, under mu, once err is: Err's common answer (nil,
	// asked after every attempt) then takes no lock.
	canceled atomic.Bool
	afters   []*afterFunc  // registered by AfterFunc and not stopped; run by cancel
	first    [1]*afterFunc // afters' first backing array: most handlers derive one context
	outputs  []*kgo.Record // emitted and not taken yet (outputs.go)
}

// afterFunc is one function registered with attemptCtx.AfterFunc.
type afterFunc struct{ f func() }

func (c *attemptCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *attemptCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		if c.err != nil {
			return closedDone
		}
		c.done = make(chan struct{})
	}
	return c.done
}

// Value is the parent's values; once the attempt is cancelled, the context
// package's lookup of the nearest canceller (context.Cause, and contexts
// derived from this one) finds one whose cause says why: ErrAttemptTimeout
// or ErrShutdownTimeout.
func (c *attemptCtx) Value(key any) any {
	if key == (attemptKey{}) {
		return c // Emit finds it under the handler's own contexts
	}
	if c.canceled.Load() {
		cause := shutdownCause
		if c.timedOut() {
			cause = timeoutCause
		}
		if v := cause.Value(key); v != nil {
			return v
		}
	}
	return c.Context.Value(key)
}

func (c *attemptCtx) Err() error {
	if !c.canceled.Load() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// cancel cancels the attempt with err (context.DeadlineExceeded for a
// timeout, context.Canceled for a hard stop) and reports whether it was
// still running.
func (c *attemptCtx) cancel(err error) bool {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	c.err = err
	c.canceled.Store(true)
	if c.done != nil {
		close(c.done)
	}
	afters := c.afters
	c.afters = nil
	c.mu.Unlock()
	// Outside mu: the context package's callbacks call Err and Value.
	for _, a := range afters {
		a.f()
	}
	return true
}

// AfterFunc arranges for f to be called once the attempt is cancelled, and
// returns a stop function that unregisters f, reporting whether it did so
// before f was called. It is what context.WithTimeout, WithCancel and
// AfterFunc look for on a parent (the afterFuncer interface) to propagate
// cancellation without a goroutine. f is called by the goroutine that
// cancels the attempt, or in a goroutine of its own if the attempt was
// already cancelled; the context package's own callbacks only cancel a
// child, and context.AfterFunc runs the user's function in a goroutine.
func (c *attemptCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		// The caller may hold a lock that f takes (propagateCancel holds
		// the child's): do not call f here.
		go f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	if c.afters == nil {
		c.afters = c.first[:0]
	}
	c.afters = append(c.afters, a)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.afters {
			if x == a {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				return true
			}
		}
		return false
	}
}

// timedOut reports whether the watchdog cancelled the attempt for its
// deadline.
func (c *attemptCtx) timedOut() bool {
	if !c.canceled.Load() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == context.DeadlineExceeded
}

// attemptSlots publishes each worker's running attempt to the watchdog.
type attemptSlots []attemptSlot

// attemptSlot is one worker's: padded to its own cache lines, since every
// worker writes its slot and two on one line would make the cores trade it.
type attemptSlot struct {
	atomic.Pointer[attemptCtx]
	_ [falseSharingPad]byte
}

// watchdog cancels attempts past their deadline, relays a hard stop to every
// running attempt, and reports partitions whose window start has not moved
// for StuckAfter. It runs until ctx (the commit/watch context) ends.
func (e *engine) watchdog(ctx context.Context, hard <-chan struct{}) {
	tick := min(max(e.cfg.attemptTimeout/8, time.Millisecond), 250*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hard:
			e.slots.cancelAll(context.Canceled)
			hard = nil
		case now := <-t.C:
			e.overdue.Store(int64(e.slots.expire(now)))
			e.detectStuck(now)
			e.sampleAnswers(now)
		}
	}
}

// cancelAll cancels every running attempt with err (the hard stop).
func (s attemptSlots) cancelAll(err error) {
	for i := range s {
		if a := s[i].Load(); a != nil {
			a.cancel(err)
		}
	}
}

// expire cancels the running attempts past their deadline at now and
// returns how many there are.
func (s attemptSlots) expire(now time.Time) (overdue int) {
	for i := range s {
		a := s[i].Load()
		if a == nil || now.Before(a.deadline) {
			continue
		}
		overdue++
		a.cancel(context.DeadlineExceeded)
	}
	return overdue
}

// stuckShareMessage is detectStuck's warning in a share group, where no
// offset is committed: the record holds its acquisition lock (renewed) and
// this member's next poll, while the other members go on.
const stuckShareMessage = "kpar: record stuck: unfinished for stuck_for; this member acquires no new records until it is acknowledged (a share group commits no offsets; the other members go on)"

// detectStuck samples each partition's window start and reports one that
// stayed on the same unfinished record for StuckAfter, once per record.
func (e *engine) detectStuck(now time.Time) {
	type stuck struct {
		tp
		offset int64
		since  time.Time
	}
	var report []stuck
	e.mu.Lock()
	for _, ps := range e.parts {
		off, ok := ps.win.Start()
		// Retry topics hold records until they are due by design; a start
		// waiting there for minutes is not stuck.
		if !ok || ps.win.Pending() == 0 || ps.level > 0 {
			ps.stuckSince = time.Time{}
			continue
		}
		if off != ps.stuckOffset || ps.stuckSince.IsZero() {
			ps.stuckOffset, ps.stuckSince, ps.stuckReported = off, now, false
			continue
		}
		if !ps.stuckReported && now.Sub(ps.stuckSince) >= e.stuckAfter {
			ps.stuckReported = true
			report = append(report, stuck{ps.tp, off, ps.stuckSince})
		}
	}
	attempts := make([]int, len(report))
	for i, s := range report {
		attempts[i] = e.attemptsOf(s.tp, s.offset)
	}
	e.mu.Unlock()
	msg := "kpar: window start stuck: one record has held back commits"
	if e.cfg.shareGroup != "" {
		// A share group commits nothing: what an unfinished record holds
		// up is this member's next poll (sharesource.go's deliver).
		msg = stuckShareMessage
	}
	for i, s := range report {
		e.log.Warn(msg,
			"topic", s.topic, "partition", s.partition, "offset", s.offset,
			"attempts", attempts[i], "stuck_for", now.Sub(s.since).Round(time.Millisecond))
		for _, h := range e.hooks.stuck {
			h.OnRecordStuck(s.topic, s.partition, s.offset, attempts[i], now.Sub(s.since))
		}
	}
}

// attemptsOf finds how many attempts the record at offset has had, among
// running records, records waiting for a retry and records waiting for a
// retry-topic or dead-letter write; 0 when it has not run. Called with mu
// held; only for reports.
func (e *engine) attemptsOf(p tp, offset int64) int {
	match := func(t *task) bool {
		if t == nil || t.Value.part.tp != p {
			return false
		}
		r := t.Value.current()
		return r != nil && r.Offset == offset
	}
	for _, r := range e.running {
		// Fast records share one attempt context; running knows which
		// record runs now, and its attempts were counted under mu.
		if match(r.t) {
			return r.t.Value.attempts
		}
	}
	for i := range e.slots {
		if a := e.slots[i].Load(); a != nil && match(a.task) {
			return a.attempt
		}
	}
	if t, ok := e.retries.Find(match); ok {
		return t.Value.attempts
	}
	return 0
}
