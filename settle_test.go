package kpar

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// flakySettle is a source whose settles fail while failing is set.
type flakySettle struct {
	e              *engine
	failing        atomic.Bool
	failed, landed atomic.Int64
}

func (f *flakySettle) open(context.Context) error    { return nil }
func (f *flakySettle) deliver(context.Context) error { return nil }
func (f *flakySettle) settleEvery() time.Duration    { return 2 * time.Millisecond }
func (f *flakySettle) pause(*partState, bool)        {}
func (f *flakySettle) stopping()                     {}
func (f *flakySettle) close(context.Context, time.Time) error {
	return nil
}

func (f *flakySettle) settle(context.Context) error {
	f.e.mu.Lock()
	f.e.outcomes.Taken() // as every source's settle does
	f.e.mu.Unlock()
	if f.failing.Load() {
		f.failed.Add(1)
		return errors.New("broker down")
	}
	f.landed.Add(1)
	return nil
}

// TestAnAssignmentDropsTheSettleBackoff: settles that failed through an
// outage back off up to 5s; once the group answers again (partitions
// assigned: settleAfresh), the next settle comes one settleEvery later,
// not after the backoff. A member whose first commit after the rejoin
// waited 2s lost it to the broker's next kill (issue 35). Virtual time.
func TestAnAssignmentDropsTheSettleBackoff(t *testing.T) {
	testSettleBackoffDropped(t, (*engine).settleAfresh)
}

// TestABrokerConnectionDropsTheSettleBackoff: so does a connection to a
// broker that succeeds (the broker is back), and a failed one does not.
func TestABrokerConnectionDropsTheSettleBackoff(t *testing.T) {
	testSettleBackoffDropped(t, func(e *engine) {
		brokerBack{e}.OnBrokerConnect(kgo.BrokerMetadata{}, time.Millisecond, nil, errors.New("connection refused"))
		brokerBack{e}.OnBrokerConnect(kgo.BrokerMetadata{}, time.Millisecond, nil, nil)
	})
}

// testSettleBackoffDropped fails settles through a 30s outage, then checks
// that after drop the next settle lands within one settleEvery.
func testSettleBackoffDropped(t *testing.T, drop func(*engine)) {
	synctest.Test(t, func(t *testing.T) {
		src := &flakySettle{}
		src.failing.Store(true)
		e := testEngineWithSource(nil, func(e *engine) source { src.e = e; return src })
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { e.settler(ctx); close(done) }()
		defer func() { cancel(); <-done }()

		e.mu.Lock()
		e.askCommit()
		e.mu.Unlock()
		time.Sleep(30 * time.Second) // the outage: the backoff reaches 5s
		synctest.Wait()
		if n := src.failed.Load(); n < 12 || n > 30 {
			t.Fatalf("%d settles failed in a 30s outage, want the backoff's 12 to 30", n)
		}

		src.failing.Store(false)
		drop(e)
		time.Sleep(src.settleEvery())
		synctest.Wait()
		if n := src.landed.Load(); n != 1 {
			t.Fatalf("one settleEvery after the backoff was dropped: %d settles landed, want 1 (not after the outage's backoff)", n)
		}
	})
}
