package kpar

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	invariant "github.com/kpar/kpar/internal/ledger"
)

// fenceTxnID initialises txnID from another client, as a broker that
// restarted does when it aborts the transaction a stop left open: the
// producer epoch of txnID moves on, and the live producer's is refused.
func fenceTxnID(t *testing.T, c cluster, txnID string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionalID, req.TransactionTimeoutMillis = kmsg.StringPtr(txnID), 60_000
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("InitProducerID of %s: %v", txnID, err)
	}
}

// TestExactlyOnceRenewsAFencedProducer: a member whose transactional
// producer is fenced in the middle of a run (a broker restart that aborted
// its open transaction, or a refusal of its epoch) commits again, with
// every output once, without a restart. franz-go holds such a producer
// failed for good ("producer ID has a fatal, unrecoverable error"): the
// member went on handling records and never committed again (the soak's
// broker restart under exactly once, 3 runs in 11).
func TestExactlyOnceRenewsAFencedProducer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault *kfake.Fault
	}{
		{name: "fenced by another InitProducerID"},
		{name: "EndTxn INVALID_PRODUCER_EPOCH", fault: &kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.InvalidProducerEpoch}},
		{name: "EndTxn PRODUCER_FENCED", fault: &kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.ProducerFenced}},
		{name: "outputs INVALID_PRODUCER_EPOCH", fault: &kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Err: kerr.InvalidProducerEpoch}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n = 1000
			c := newFakeCluster(t, "injects broker faults", "in", 4)
			createTopic(t, c, "out", 4)
			l := invariant.New(invariant.ByKey, n)
			produce(t, c, "in", n/2, 50, l.Produced)
			h := emitThenRecord(l, "out")
			cons, err := New(h, append(testOpts(c, "g", "in"), ExactlyOnce(), InstanceID("m1"), Concurrency(8))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			waitFor(t, l.Reached(n/4), 30*time.Second, "a quarter of the records")
			var fh *kfake.FaultHandle
			if tc.fault != nil {
				fh = c.Fault(*tc.fault)
			} else {
				fenceTxnID(t, c, "g-m1")
			}
			produceRange(t, c, "in", n/2, n, 50, l.Produced)
			waitFor(t, l.AllHandled(), 30*time.Second, "every record")
			if fh != nil {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				err := fh.Wait(ctx, 1)
				cancel()
				if err != nil {
					t.Fatalf("the fault never hit: %v", err)
				}
			}
			// The same member, not a restarted one, commits to the end.
			awaitCommittedAtEnd(t, c, "g", "in", "after the producer was fenced")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			checkOutputs(t, l, readOutputs(t, c, "out", n, 30*time.Second), true)
		})
	}
}

// TestExactlyOnceGivesUpOnAProducerFencedOverAndOver: a member whose
// producer is fenced at every transaction, with none committing in
// between (another producer with its transactional ID keeps fencing it),
// ends Run with ErrProducerFenced, naming the transactional ID, after
// maxRenewals new producers, rather than fencing the other one for ever.
func TestExactlyOnceGivesUpOnAProducerFencedOverAndOver(t *testing.T) {
	c := newFakeCluster(t, "injects broker faults", "in", 1)
	createTopic(t, c, "out", 1)
	produce(t, c, "in", 20, 2)
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error { return Emit(ctx, outputOf("out", r)) })
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.ProducerFenced, Count: -1})
	cons, err := New(h, append(testOpts(c, "g", "in"), ExactlyOnce(), InstanceID("m1"))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	err = cons.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run still ran after 90s: %v", err)
	}
	if !errors.Is(err, ErrProducerFenced) || !errors.Is(err, kerr.ProducerFenced) {
		t.Fatalf("Run = %v, want ErrProducerFenced wrapping PRODUCER_FENCED", err)
	}
	if want := `"g-m1"`; !containsAll(err.Error(), want) {
		t.Errorf("Run = %v, want it to name the transactional ID %s", err, want)
	}
}
