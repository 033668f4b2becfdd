package kpar

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	invariant "github.com/kpar/kpar/internal/ledger"
)

// outputOf is the output a test handler emits for r: keyed like r, its
// value naming r's partition and offset.
func outputOf(topic string, r *kgo.Record) *kgo.Record {
	v := binary.BigEndian.AppendUint32(nil, uint32(r.Partition))
	v = binary.BigEndian.AppendUint64(v, uint64(r.Offset))
	return &kgo.Record{Topic: topic, Key: r.Key, Value: append(v, r.Value...)}
}

// inputOf reads back which input an output of outputOf belongs to.
func inputOf(out *kgo.Record) (partition int32, offset int64, value []byte) {
	return int32(binary.BigEndian.Uint32(out.Value)), int64(binary.BigEndian.Uint64(out.Value[4:])), out.Value[12:]
}

// readOutputs reads every record of topic with read_committed isolation,
// until it has want records or d passed, and then a little longer for any
// extra.
func readOutputs(t *testing.T, c cluster, topic string, want int, d time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []*kgo.Record
	quiet := 0
	for ctx.Err() == nil && (len(out) < want || quiet < 3) {
		pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		fs := cl.PollFetches(pctx)
		pcancel()
		n := len(out)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
		if len(out) >= want && len(out) == n {
			quiet++
		}
	}
	return out
}

// checkOutputs checks that every produced input has exactly one output (at
// least one when exact is false), and, per key, that outputs come in input
// order where the mode keeps one.
func checkOutputs(t *testing.T, outs []*kgo.Record, inputs int, order Order, exact bool) {
	t.Helper()
	seen := map[[2]int64]int{}
	last := map[string][2]int64{}
	for _, o := range outs {
		p, off, _ := inputOf(o)
		k := [2]int64{int64(p), off}
		seen[k]++
		if order == Unordered {
			continue
		}
		// Outputs of a key share a partition of the output topic; those of
		// an input partition do not, so order is checked per key in both
		// ordered modes.
		key := string(o.Key)
		if prev, ok := last[key]; ok && prev[0] == int64(p) && prev[1] >= off && seen[k] == 1 {
			t.Errorf("output of %d/%d after that of %d/%d: key %q out of order", p, off, prev[0], prev[1], key)
		}
		if seen[k] == 1 {
			last[key] = k
		}
	}
	if len(seen) != inputs {
		t.Errorf("%d inputs have outputs, want %d", len(seen), inputs)
	}
	for k, n := range seen {
		if exact && n != 1 || n < 1 {
			t.Errorf("input %d/%d has %d outputs, want %s", k[0], k[1], n, map[bool]string{true: "exactly 1", false: "1 or more"}[exact])
		}
	}
}

// TestOutputsAtLeastOnceAndExactlyOnce: a handler that emits one output per
// input gets each output produced, at least once with Outputs, exactly once
// with ExactlyOnce, in every ordering mode.
func TestOutputsAtLeastOnceAndExactlyOnce(t *testing.T) {
	for _, eos := range []bool{false, true} {
		for _, mode := range orderModes() {
			name := "at-least-once/" + mode.order.String()
			if eos {
				name = "exactly-once/" + mode.order.String()
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				const n = 1000
				c := newFakeCluster(t, notPorted, "in", 4)
				l := invariant.New(mode.check, n)
				produce(t, c, "in", n, 40, l.Produced)
				h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
					if err := Emit(ctx, outputOf("out", r)); err != nil {
						return err
					}
					l.Handled(r)
					return nil
				})
				opt := ConsumerOpt(Outputs())
				if eos {
					opt = ExactlyOnce()
				}
				cons, err := New(h, append(testOpts(c, "g", "in"), Ordering(mode.order), opt, InstanceID("m1"),
					ClientOptions(kgo.AllowAutoTopicCreation()))...)
				if err != nil {
					t.Fatal(err)
				}
				stop := runConsumer(t, cons)
				waitFor(t, l.AllHandled(), 30*time.Second, "every record")
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				checkOutputs(t, readOutputs(t, c, "out", n, 20*time.Second), n, mode.order, eos)
			})
		}
	}
}

// TestEmitOutsideOutputs: Emit without Outputs, or outside a handler,
// says what is missing.
func TestEmitOutsideOutputs(t *testing.T) {
	if err := Emit(context.Background(), &kgo.Record{Topic: "t"}); err != ErrNoOutputs {
		t.Fatalf("Emit outside a handler = %v, want ErrNoOutputs", err)
	}
	_, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		Brokers("127.0.0.1:1"), Group("g"), Topics("t"), ExactlyOnce())
	if err == nil || !strings.Contains(err.Error(), "InstanceID or TransactionalID") {
		t.Fatalf("ExactlyOnce without a transactional ID: %v", err)
	}
	_ = rand.IntN
	_ = os.Getenv
}
