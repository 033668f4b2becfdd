package kpar

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

func TestBackoffIsFullJitterCapped(t *testing.T) {
	c := &cfg{retryBase: 100 * time.Millisecond, retryMax: 10 * time.Second}
	for attempt := 1; attempt <= 70; attempt++ {
		ceiling := 10 * time.Second
		if attempt < 8 {
			ceiling = min(100*time.Millisecond<<(attempt-1), ceiling)
		}
		for range 50 {
			if d := c.backoff(attempt); d <= 0 || d > ceiling {
				t.Fatalf("backoff(%d) = %v, want in (0, %v]", attempt, d, ceiling)
			}
		}
	}
}

// TestWatchdogCancelsOverdueAttempts runs the watchdog in virtual time: an
// attempt's context is cancelled with DeadlineExceeded soon after its
// deadline and not before, and a hard stop cancels every running attempt.
func TestWatchdogCancelsOverdueAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = time.Second
		e := testEngine(func(c *cfg) { c.attemptTimeout, c.concurrency, c.stuckAfter = timeout, 2, time.Hour })
		ctx, stop := context.WithCancel(context.Background())
		hard := make(chan struct{})
		done := make(chan struct{})
		go func() { e.watchdog(ctx, hard); close(done) }()

		slow := &attemptCtx{Context: context.Background(), deadline: time.Now().Add(timeout)}
		e.slots[0].Store(slow)
		time.Sleep(timeout - time.Millisecond)
		synctest.Wait()
		if slow.Err() != nil {
			t.Fatalf("cancelled before its deadline: %v", slow.Err())
		}
		select {
		case <-slow.Done():
		case <-time.After(timeout): // virtual: fails only if never cancelled
			t.Fatal("attempt past its deadline was not cancelled")
		}
		if slow.Err() != context.DeadlineExceeded || !slow.timedOut() || e.overdue.Load() != 1 {
			t.Fatalf("Err = %v, timedOut = %v, overdue = %d", slow.Err(), slow.timedOut(), e.overdue.Load())
		}
		e.slots[0].Store(nil)

		running := &attemptCtx{Context: context.Background(), deadline: time.Now().Add(time.Hour)}
		e.slots[1].Store(running)
		close(hard)
		<-running.Done()
		if running.Err() != context.Canceled || running.timedOut() {
			t.Fatalf("after a hard stop: Err = %v, timedOut = %v", running.Err(), running.timedOut())
		}
		stop()
		<-done
	})
}

func TestAttemptContextCarriesParentValues(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")
	a := &attemptCtx{Context: parent, deadline: time.Now().Add(time.Minute)}
	if a.Value(key{}) != "v" {
		t.Fatal("attempt context lost the parent's values")
	}
	if d, ok := a.Deadline(); !ok || !d.Equal(a.deadline) {
		t.Fatalf("Deadline = %v, %v", d, ok)
	}
	// A handler deriving its own context sees the cancellation.
	child, cancel := context.WithCancel(a)
	defer cancel()
	a.cancel(context.DeadlineExceeded)
	<-child.Done()
}

// TestDerivedContextsStartNoGoroutine: contexts a handler derives from its
// attempt context (WithTimeout, WithCancel, AfterFunc) are cancelled with it,
// through AfterFunc, without a goroutine each; a derived context cancelled
// first unregisters itself.
func TestDerivedContextsStartNoGoroutine(t *testing.T) {
	actx := &attemptCtx{Context: context.Background(), deadline: time.Now().Add(time.Hour)}
	before := runtime.NumGoroutine()
	const n = 100
	children := make([]context.Context, n)
	for i := range children {
		var cancel context.CancelFunc
		children[i], cancel = context.WithTimeout(actx, time.Hour)
		defer cancel()
	}
	called := make(chan struct{})
	context.AfterFunc(actx, func() { close(called) })
	if grown := runtime.NumGoroutine() - before; grown >= n/2 {
		t.Fatalf("%d goroutines for %d derived contexts", grown, n)
	}
	early, cancelEarly := context.WithCancel(actx)
	cancelEarly()
	actx.mu.Lock()
	registered := len(actx.afters)
	actx.mu.Unlock()
	if registered != n+1 {
		t.Fatalf("%d functions registered, want %d (the cancelled child unregistered)", registered, n+1)
	}
	actx.cancel(context.DeadlineExceeded)
	for i, c := range children {
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("child %d not cancelled with its attempt", i)
		}
		if c.Err() != context.DeadlineExceeded {
			t.Fatalf("child %d: Err = %v, want DeadlineExceeded", i, c.Err())
		}
	}
	<-called
	if early.Err() != context.Canceled {
		t.Fatalf("early child: %v", early.Err())
	}
	// Deriving from an attempt already cancelled cancels at once.
	late, cancelLate := context.WithTimeout(actx, time.Hour)
	defer cancelLate()
	<-late.Done()
}

// BenchmarkHandlerDerivesTimeout is a handler that derives a timeout from
// its attempt context, as an HTTP or database call does: with AfterFunc the
// context package registers the child on the attempt instead of starting a
// goroutine for it.
func BenchmarkHandlerDerivesTimeout(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		actx := &attemptCtx{Context: context.Background(), deadline: time.Now().Add(time.Minute)}
		ctx, cancel := context.WithTimeout(actx, time.Second)
		select { // a handler that watches Done
		case <-ctx.Done():
		default:
		}
		cancel()
	}
}

// TestAttemptContextSaysWhyItWasCancelled: a handler tells an attempt
// timeout from a shutdown through context.Cause, on its own context and on
// contexts it derived before or after the cancellation, and the parent's
// values stay reachable.
func TestAttemptContextSaysWhyItWasCancelled(t *testing.T) {
	type key struct{}
	parent, stopParent := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	defer stopParent()
	for _, tc := range []struct {
		name  string
		err   error
		cause error
	}{
		{"attempt timeout", context.DeadlineExceeded, ErrAttemptTimeout},
		{"shutdown", context.Canceled, ErrShutdownTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &attemptCtx{Context: parent, deadline: time.Now().Add(time.Minute)}
			if got := context.Cause(a); got != nil {
				t.Fatalf("Cause before any cancel = %v, want nil", got)
			}
			before, cancel := context.WithCancel(a)
			defer cancel()
			a.cancel(tc.err)
			after, cancel2 := context.WithTimeout(a, time.Hour)
			defer cancel2()
			<-before.Done()
			for name, ctx := range map[string]context.Context{"attempt": a, "derived before": before, "derived after": after} {
				if got := context.Cause(ctx); got != tc.cause {
					t.Errorf("%s: Cause = %v, want %v", name, got, tc.cause)
				}
				if ctx.Err() != tc.err {
					t.Errorf("%s: Err = %v, want %v", name, ctx.Err(), tc.err)
				}
				if ctx.Value(key{}) != "v" {
					t.Errorf("%s: the parent's value is gone after the cancel", name)
				}
			}
			if tc.cause == ErrAttemptTimeout && !errors.Is(context.Cause(a), context.DeadlineExceeded) {
				t.Error("ErrAttemptTimeout does not wrap context.DeadlineExceeded")
			}
		})
	}
}
