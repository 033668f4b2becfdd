package kpar

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	invariant "github.com/kpar/kpar/internal/ledger"
)

// outputOf is the output a test handler emits for r: keyed like r, its
// value naming r's partition and offset.
func outputOf(topic string, r *kgo.Record) *kgo.Record {
	v := binary.BigEndian.AppendUint32(nil, uint32(r.Partition))
	v = binary.BigEndian.AppendUint64(v, uint64(r.Offset))
	return &kgo.Record{Topic: topic, Key: r.Key, Value: append(v, r.Value...)}
}

// emitThenRecord is a test handler that emits outputOf(topic, r) for each
// record and then records it handled in l.
func emitThenRecord(l *invariant.Ledger, topic string) Handler {
	return HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if err := Emit(ctx, outputOf(topic, r)); err != nil {
			return err
		}
		l.Handled(r)
		return nil
	})
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

// checkOutputs notes what a reader read in l (whose inputs were
// produced through it) and checks that every input has exactly one output
// (at least one when exact is false), and a key's outputs come in input
// order where l's order keeps one.
func checkOutputs(t *testing.T, l *invariant.Ledger, outs []*kgo.Record, exact bool) {
	t.Helper()
	l.ExpectOutputs()
	for _, o := range outs {
		p, off, _ := inputOf(o)
		l.Output("in", p, off, o.Key) // the input topic of these tests
	}
	if err := l.Report().CheckOutputs(exact); err != nil {
		t.Error(err)
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
				h := emitThenRecord(l, "out")
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
				checkOutputs(t, l, readOutputs(t, c, "out", n, 20*time.Second), eos)
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
}

// TestExactlyOnceOutputsSurviveKills SIGKILLs a member with ExactlyOnce
// (a child process running this test binary) again and again while it
// handles records, each time restarting it with the same instance ID, in
// every ordering mode: a read_committed reader of the output topic then
// finds every input's output exactly once, and a key's outputs in input
// order. KPAR_CHAOS_SOAK=1 kills 10 times over 20,000 records instead of 3
// times over 3,000.
func TestExactlyOnceOutputsSurviveKills(t *testing.T) {
	if env := os.Getenv("KPAR_EOS_CHILD"); env != "" {
		eosChild(env)
		return
	}
	n, kills := 3000, 3
	if os.Getenv("KPAR_CHAOS_SOAK") != "" {
		n, kills = 20000, 10
	}
	for _, mode := range orderModes() {
		t.Run(mode.order.String(), func(t *testing.T) {
			t.Parallel()
			c := newFakeCluster(t, "kills member processes", "in", 4)
			l := invariant.New(mode.check, int64(n))
			produce(t, c, "in", n, 100, l.Produced)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			adm := adminClient(t, c)
			progress := func() (done, total int64) {
				ends, err := adm.ListEndOffsets(ctx, "in")
				if err != nil {
					return 0, 1
				}
				ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
				if os, err := adm.FetchOffsets(ctx, "eos"); err == nil { // no group before the first commit
					os.Each(func(o kadm.OffsetResponse) {
						if o.Topic == "in" {
							done += max(o.At, 0)
						}
					})
				}
				return done, total
			}
			for k := 0; k <= kills; k++ {
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestExactlyOnceOutputsSurviveKills$")
				cmd.Env = append(os.Environ(), "KPAR_EOS_CHILD="+strings.Join(c.ListenAddrs(), ",")+";"+mode.order.String())
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				// Kill once the commits moved on by a share of the rest,
				// and the last member once everything is committed.
				before, total := progress()
				target := before + (total-before)/int64(kills+1-k)
				if k == kills {
					target = total
				}
				target += rand.Int64N(max(total/int64(10*(kills+1)), 1)) // not always at a commit
				target = min(target, total)
				for {
					if done, _ := progress(); done >= target {
						break
					}
					if ctx.Err() != nil {
						cmd.Process.Kill()
						cmd.Wait()
						t.Fatalf("kill %d: no progress to %d of %d committed", k, target, total)
					}
					time.Sleep(20 * time.Millisecond) // polling the broker's offsets
				}
				cmd.Process.Kill()
				cmd.Wait()
			}
			checkOutputs(t, l, readOutputs(t, c, "out", n, 30*time.Second), true)
		})
	}
}

// eosChild is the member TestExactlyOnceOutputsSurviveKills kills: env is
// "brokers;mode".
func eosChild(env string) {
	brokers, mode, _ := strings.Cut(env, ";")
	var o Order
	if err := o.UnmarshalText([]byte(mode)); err != nil {
		panic(err)
	}
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		return Emit(ctx, outputOf("out", r))
	})
	cons, err := New(h,
		Brokers(strings.Split(brokers, ",")...), Group("eos"), Topics("in"), Ordering(o),
		ExactlyOnce(), InstanceID("eos-member"), CommitInterval(20*time.Millisecond), Concurrency(16),
		WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))),
		ClientOptions(kgo.SessionTimeout(2*time.Second), kgo.HeartbeatInterval(100*time.Millisecond), kgo.AllowAutoTopicCreation()),
	)
	if err != nil {
		panic(err)
	}
	cons.Run(context.Background())
}

// TestExactlyOnceThroughFaults: with ExactlyOnce, each input's output is
// seen exactly once by a read_committed reader when, in the middle of a
// run: another member joins (a rebalance revokes partitions while
// transactions run); the member loses its partitions (a heartbeat fenced:
// the outputs of their finished records are dropped with them, and their
// new owner emits them again); the broker refuses the transaction's offset
// commit, its end, or its outputs (the transaction aborts, and its outputs
// go into the next one).
func TestExactlyOnceThroughFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults []kfake.Fault
		join   bool
	}{
		{name: "another member joins", join: true},
		{name: "partitions lost", faults: []kfake.Fault{{Keys: []kmsg.Key{kmsg.Heartbeat}, Err: kerr.UnknownMemberID}}},
		{name: "TxnOffsetCommit refused", faults: []kfake.Fault{{Keys: []kmsg.Key{kmsg.TxnOffsetCommit}, Err: kerr.UnknownServerError, Count: 2}}},
		{name: "EndTxn refused", faults: []kfake.Fault{{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.UnknownServerError, Count: 2}}},
		{name: "outputs refused", faults: []kfake.Fault{{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Err: kerr.UnknownServerError, Count: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n = 2000
			c := newFakeCluster(t, "injects broker faults", "in", 4)
			createTopic(t, c, "out", 4)
			l := invariant.New(invariant.ByKey, n)
			produce(t, c, "in", n/2, 50, l.Produced)
			h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
				time.Sleep(200 * time.Microsecond)
				if err := Emit(ctx, outputOf("out", r)); err != nil {
					return err
				}
				l.Handled(r)
				return nil
			})
			member := func(id string) func() error {
				cons, err := New(h, append(testOpts(c, "g", "in"), ExactlyOnce(), InstanceID(id), Concurrency(16))...)
				if err != nil {
					t.Fatal(err)
				}
				return runConsumer(t, cons)
			}
			stop := member("m1")
			waitFor(t, l.Reached(n/4), 30*time.Second, "a quarter of the records")
			var fh *kfake.FaultHandle
			if tc.faults != nil {
				fh = c.Fault(tc.faults...)
			}
			stops := []func() error{stop}
			if tc.join {
				stops = append(stops, member("m2"))
			}
			produceRange(t, c, "in", n/2, n, 50, l.Produced)
			waitFor(t, l.AllHandled(), 60*time.Second, "every record")
			if fh != nil {
				// The last transactions may come after every record was
				// handled: the fault hits them then.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := fh.Wait(ctx, 1)
				cancel()
				if err != nil {
					t.Fatalf("the fault never hit: %v", err)
				}
			}
			for _, stop := range stops {
				// The fault may hit the final transaction: Run says so.
				if err := stop(); err != nil && !errors.Is(err, ErrFinalCommit) {
					t.Fatal(err)
				}
			}
			// A fault may have aborted the last transactions too: what
			// they held was not committed, and a member handles it again,
			// emitting its outputs again, once.
			stop = member("m1")
			awaitCommittedAtEnd(t, c, "g", "in", "after the faults")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			checkOutputs(t, l, readOutputs(t, c, "out", n, 30*time.Second), true)
		})
	}
}

// TestOutputsInFlightFreeTheWorker: at least once, a worker hands a
// record's outputs to the producer and runs the next record without
// waiting for their acknowledgement, but a key's next record waits for it,
// and the offset is committed only once they are acknowledged. With one
// worker and the outputs' produce held by the broker, the first record of
// every key runs; none of their second records does until the produce is
// let through; then every output is there, in key order, and committed.
func TestOutputsInFlightFreeTheWorker(t *testing.T) {
	const keys = 5
	c := newFakeCluster(t, "holds the outputs' Produce with a kfake control", "in", 1)
	produce(t, c, "in", 2*keys, keys) // offsets 0-4 keys 0-4, then 5-9 the same keys
	var released atomic.Bool
	release := make(chan struct{})
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() { <-release }) // only the outputs' client produces now
		return nil, nil, false
	})
	var (
		mu         sync.Mutex
		handled    = map[int64]bool{}
		firstRound = make(chan struct{})
	)
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if r.Offset >= keys && !released.Load() {
			t.Errorf("offset %d ran before the output of its key's record before it was acknowledged", r.Offset)
		}
		if err := Emit(ctx, outputOf("out", r)); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		handled[r.Offset] = true
		if len(handled) == keys && r.Offset < keys {
			close(firstRound)
		}
		return nil
	})
	done := &commitReaches{want: 2 * keys, reached: make(chan struct{})}
	cons, err := New(h, append(testOpts(c, "g", "in"), Ordering(ByKey), Concurrency(1), Outputs(), WithHooks(done),
		ClientOptions(kgo.AllowAutoTopicCreation()))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, firstRound, 30*time.Second, "the first record of every key, run by the one worker while the outputs wait for the broker")
	if committed, _ := offsets(t, c, "g", "in"); committed[0] > 0 {
		t.Errorf("committed %d while no output was acknowledged", committed[0])
	}
	released.Store(true)
	close(release)
	waitFor(t, done.reached, 30*time.Second, "the commit of every record once the outputs are acknowledged")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	outs := readOutputs(t, c, "out", 2*keys, 20*time.Second)
	for _, o := range outs {
		_, off, _ := inputOf(o)
		if prev, ok := last[string(o.Key)]; ok && off < prev {
			t.Errorf("key %s: output of offset %d after that of %d", o.Key, off, prev)
		}
		last[string(o.Key)] = off
	}
	if len(outs) != 2*keys {
		t.Errorf("%d outputs, want %d", len(outs), 2*keys)
	}
}
