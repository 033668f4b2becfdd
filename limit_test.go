package kpar

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/twmb/franz-go/pkg/kgo"
)

// errBusy is what the capacity-limited downstream of these tests answers
// beyond its capacity, like an HTTP 429.
var errBusy = errors.New("429 Too Many Requests")

// capacityHandler stands in for a downstream that serves capacity requests
// at once in work each and rejects the rest at once, marked Overloaded.
func capacityHandler(capacity int64, work time.Duration, done func(*kgo.Record)) Handler {
	var inflight atomic.Int64
	return HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		defer inflight.Add(-1)
		if inflight.Add(1) > capacity {
			return Overloaded(errBusy)
		}
		time.Sleep(work) // the downstream's own work
		done(r)
		return nil
	})
}

// TestAdaptiveConcurrencyDeadLettersNothing: with a ceiling of 256
// against a downstream that takes 16 at once, the adaptive limit settles
// near 16, and no record exhausts its attempts on the rejections.
func TestAdaptiveConcurrencyDeadLettersNothing(t *testing.T) {
	const n = 3000
	c := newFakeCluster(t, notPorted, "adaptive", 4)
	l := invariant.New(invariant.Unordered, n)
	produce(t, c, "adaptive", n, n, l.Produced)
	sink := &memSink{}
	var maxLimit atomic.Int64
	var cons *Consumer
	h := capacityHandler(16, 2*time.Millisecond, func(r *kgo.Record) {
		l.Handled(r)
		if c := cons; c != nil {
			if lim := int64(c.ConcurrencyLimit()); lim > maxLimit.Load() {
				maxLimit.Store(lim)
			}
		}
	})
	var err error
	cons, err = New(h, append(testOpts(c, "g", "adaptive"), Ordering(Unordered), Concurrency(256), AdaptiveConcurrency(),
		MaxAttempts(3), DeadLetters(sink))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, l.AllHandled(), 60*time.Second, "every record handled")
	final := cons.ConcurrencyLimit()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.letters) != 0 {
		t.Fatalf("%d records dead-lettered for the downstream's overload: %s", len(sink.letters), sink.letters[0].Message)
	}
	if final < 1 || final > 64 {
		t.Errorf("limit %d at the end against a capacity of 16, want 1 to 64", final)
	}
	t.Logf("limit at the end %d, highest seen %d", final, maxLimit.Load())
}
