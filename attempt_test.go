package kpar

import (
	"context"
	"log/slog"
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
		e := &engine{
			cfg:        &cfg{attemptTimeout: timeout},
			log:        slog.New(slog.DiscardHandler),
			parts:      map[tp]*partState{},
			slots:      make(attemptSlots, 2),
			stuckAfter: time.Hour,
		}
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
