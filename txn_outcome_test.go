package kpar

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	invariant "github.com/kpar/kpar/internal/ledger"
)

// TestExactlyOnceACommitWhoseAnswerIsLostIsNotRepeated: a transaction the
// broker committed, whose answer the member never got (the broker died
// after writing the commit), and whose outcome the member's first read of
// the group's offsets cannot tell (the broker not back yet), is not
// produced again: the member reads the offsets until the broker answers,
// finds its commit there, and goes on. It took the failed read for "not
// committed" and produced the transaction's outputs again (the fault
// matrix's broker restarts under exactly once: 3 to 1,644 replies twice).
func TestExactlyOnceACommitWhoseAnswerIsLostIsNotRepeated(t *testing.T) {
	const n = 20
	c := newFakeCluster(t, "loses an EndTxn's answer", "in", 1)
	createTopic(t, c, "out", 1)
	l := invariant.New(invariant.ByKey, n)
	produce(t, c, "in", n, 4, l.Produced)

	side, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer side.Close()
	var lost, armed, sideRunning atomic.Bool
	sideErr := make(chan error, 1)
	c.ControlKey(int16(kmsg.EndTxn), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.EndTxnRequest)
		if sideRunning.Load() || !req.Commit || lost.Swap(true) {
			return nil, nil, false
		}
		// The broker commits (here: the same EndTxn, sent on another
		// connection while this one waits), and its answer is lost.
		c.SleepControl(func() {
			sideRunning.Store(true)
			again := *req
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := again.RequestWith(ctx, side)
			if err == nil {
				err = kerr.ErrorForCode(resp.ErrorCode)
			}
			sideErr <- err
			sideRunning.Store(false)
			armed.Store(true)
		})
		resp := req.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.UnknownServerError.Code
		return resp, nil, true
	})
	// The first read of the group's offsets after that fails: the broker
	// is not back.
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetFetch}, Err: kerr.GroupAuthorizationFailed, When: func(kmsg.Request) bool { return armed.Load() }})

	h := emitThenRecord(l, "out")
	cons, err := New(h, append(testOpts(c, "g", "in"), ExactlyOnce(), InstanceID("m1"))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, l.AllHandled(), 30*time.Second, "every record")
	select {
	case err := <-sideErr:
		if err != nil {
			t.Fatalf("committing the transaction on the side: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no transaction committed")
	}
	awaitCommittedAtEnd(t, c, "g", "in", "after the lost answer")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkOutputs(t, l, readOutputs(t, c, "out", n, 20*time.Second), true)
}
