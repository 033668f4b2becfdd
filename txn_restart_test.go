package kpar

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar/internal/testkit"
)

// openPredecessorTxn leaves, as a member killed mid-transaction does, an
// open transaction of txnID holding an output record and an offset commit
// of group: until it ends, the broker answers the group's offset fetches
// UNSTABLE_OFFSET_COMMIT (KIP-447). The transaction times out after
// timeout.
func openPredecessorTxn(t *testing.T, addrs []string, txnID, group, topic string, timeout time.Duration) {
	t.Helper()
	ctx := t.Context()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.TransactionalID(txnID), kgo.TransactionTimeout(timeout),
		kgo.DefaultProduceTopic("out"), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close) // the killed process: it never ends its transaction
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("predecessor's output")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := testkit.CommitOffsetsInTxn(ctx, cl, txnID, group, topic, map[int32]int64{0: 1}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceRestartEndsThePredecessorsTransactionAtOnce: a member
// restarted with its transactional ID after a kill -9 in the middle of a
// transaction that held an offset commit handles records at once. It
// waited out the predecessor's transaction timeout (franz-go's default
// 40s; 1 restart in 60 of the probe stalled ~40 s, silently): the group's
// offset fetch answers UNSTABLE_OFFSET_COMMIT until that transaction ends,
// and nothing ended it before the member's first own transaction, which
// waited for records.
func TestExactlyOnceRestartEndsThePredecessorsTransactionAtOnce(t *testing.T) {
	const topic, group, n = "in", "eos-restart", 10
	c := newFakeCluster(t, "leaves a transaction open", topic, 1)
	produce(t, c, topic, n, 2)
	openPredecessorTxn(t, c.ListenAddrs(), group+"-m1", group, topic, 45*time.Second)

	var handled atomic.Int64
	first := make(chan struct{})
	h := HandlerFunc(func(context.Context, *kgo.Record) error {
		if handled.Add(1) == 1 {
			close(first)
		}
		return nil
	})
	cons, err := New(h, append(testOpts(c, group, topic), ExactlyOnce(), InstanceID("m1"))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	// Well below the predecessor's 45s timeout: a restart must not wait
	// for it.
	waitFor(t, first, 20*time.Second, "the first record after the restart")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestExactlyOnceRetriesAFailedProducerInitialisation: a broker that
// answers the first InitProducerID with a retriable error
// (COORDINATOR_LOAD_IN_PROGRESS) delays the member, logged, rather than
// failing Run; an error franz-go keeps for good (UNKNOWN_SERVER_ERROR,
// TRANSACTIONAL_ID_AUTHORIZATION_FAILED) fails Run at once, naming the
// transactional ID.
func TestExactlyOnceRetriesAFailedProducerInitialisation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		code  int16
		fatal bool
	}{
		{"coordinator loading", kerr.CoordinatorLoadInProgress.Code, false},
		{"unknown server error", kerr.UnknownServerError.Code, true},
		{"not authorized", kerr.TransactionalIDAuthorizationFailed.Code, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const topic, group = "in", "eos-init"
			c := newFakeCluster(t, "refuses InitProducerID", topic, 1)
			produce(t, c, topic, 3, 1)
			var refused atomic.Int64
			c.ControlKey(int16(kmsg.InitProducerID), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
				req := kreq.(*kmsg.InitProducerIDRequest)
				if req.TransactionalID == nil || (!tc.fatal && refused.Load() > 0) {
					return nil, nil, false
				}
				c.KeepControl()
				refused.Add(1)
				resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
				resp.ErrorCode = tc.code
				return resp, nil, true
			})
			first := make(chan struct{})
			var once atomic.Bool
			h := HandlerFunc(func(context.Context, *kgo.Record) error {
				if once.CompareAndSwap(false, true) {
					close(first)
				}
				return nil
			})
			cons, err := New(h, append(testOpts(c, group, topic), ExactlyOnce(), InstanceID("m1"))...)
			if err != nil {
				t.Fatal(err)
			}
			if tc.fatal {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				err := cons.Run(ctx)
				if err == nil || !errors.Is(err, kerr.ErrorForCode(tc.code)) || !strings.Contains(err.Error(), `"eos-init-m1"`) {
					t.Fatalf("Run = %v, want %v naming the transactional ID", err, kerr.ErrorForCode(tc.code))
				}
				return
			}
			stop := runConsumer(t, cons)
			waitFor(t, first, 30*time.Second, "the first record after a refused initialisation")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if refused.Load() != 1 {
				t.Errorf("InitProducerID refused %d times, want 1", refused.Load())
			}
		})
	}
}
