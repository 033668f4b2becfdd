package kpar

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestNoLossWithFailuresAndPanics: 50,000 records over 8 partitions, the
// handler fails 5% of attempts and panics on 0.5%. Every record is handled
// successfully at least once and the committed offsets end at the high
// watermarks.
func TestNoLossWithFailuresAndPanics(t *testing.T) {
	const n, parts = 50_000, 8
	c := newCluster(t, "orders", parts)
	led := invariant.New(invariant.ByKey, n)
	produce(t, c, "orders", n, 1000, led.Produced)

	var failures, panics atomic.Int64
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		switch x := rand.IntN(1000); {
		case x < 5:
			panics.Add(1)
			panic("injected panic")
		case x < 55:
			failures.Add(1)
			return errors.New("injected failure")
		}
		led.Handled(r)
		return nil
	})
	cons, err := New(h, append(testOpts(c, "g", "orders"), WithHooks(newCommitWatch(led)))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, led.AllHandled(), 60*time.Second, "every record handled")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	committed, end := offsets(t, c, "g", "orders")
	for p, hwm := range end {
		if committed[p] != hwm {
			t.Errorf("partition %d: committed %d, high watermark %d", p, committed[p], hwm)
		}
	}
	rep := led.Report()
	t.Logf("%d injected failures, %d panics; %+v", failures.Load(), panics.Load(), rep)
	if err := rep.Check(0); err != nil {
		t.Fatal(err)
	}
	if failures.Load() == 0 || panics.Load() == 0 {
		t.Fatal("the test injected no failures or no panics")
	}
}

// TestOrderingModes is one behavioural suite over every ordering mode: no
// loss, and the order each mode promises.
func TestOrderingModes(t *testing.T) {
	for _, mode := range []Order{ByKey, ByPartition, Unordered} {
		t.Run(mode.String(), func(t *testing.T) {
			const n, parts, keys = 5000, 8, 100
			c := newCluster(t, "events", parts)
			led := invariant.New(ledgerOrder(mode), n)
			produce(t, c, "events", n, keys, led.Produced)

			var (
				mu         sync.Mutex
				nextSeq    = map[int]int{}     // key -> next expected sequence
				lastOffset = map[int32]int64{} // partition -> last handled offset
				violations []string
				running    atomic.Int64
				maxRunning atomic.Int64
			)
			h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
				cur := running.Add(1)
				defer running.Add(-1)
				for m := maxRunning.Load(); cur > m && !maxRunning.CompareAndSwap(m, cur); m = maxRunning.Load() {
				}
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
				v := decodeValue(r.Value)
				mu.Lock()
				if mode == ByKey && v.seq != nextSeq[v.key] {
					violations = append(violations, fmt.Sprintf("key %d: got seq %d, want %d", v.key, v.seq, nextSeq[v.key]))
				}
				nextSeq[v.key] = v.seq + 1
				if last, ok := lastOffset[r.Partition]; mode == ByPartition && ok && r.Offset != last+1 {
					violations = append(violations, fmt.Sprintf("partition %d: offset %d after %d", r.Partition, r.Offset, last))
				}
				lastOffset[r.Partition] = r.Offset
				mu.Unlock()
				led.Handled(r)
				return nil
			})
			cons, err := New(h, append(testOpts(c, "g", "events"), Ordering(mode), Concurrency(32), WithHooks(newCommitWatch(led)))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			waitFor(t, led.AllHandled(), 60*time.Second, "every record handled")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if len(violations) > 0 {
				t.Fatalf("%d order violations, first: %s", len(violations), violations[0])
			}
			// No duplicates without failures or rebalances.
			if err := led.Report().Check(0); err != nil {
				t.Error(err)
			}
			// Parallelism actually happened: more than one record at once
			// (Partition mode is bounded by the 8 partitions).
			if maxRunning.Load() < 2 {
				t.Errorf("at most %d record in flight; want parallel handling", maxRunning.Load())
			}
			t.Logf("max in flight %d", maxRunning.Load())
		})
	}
}

// TestBackPressurePausesAndResumes: with a blocked handler the window fills
// to its limit and no further, the partition is paused, and it resumes when
// the handler is released.
func TestBackPressurePausesAndResumes(t *testing.T) {
	const n, window = 500, 40
	c := newFakeCluster(t, notPorted, "slow", 1)
	led := invariant.New(invariant.Unordered, n)
	produce(t, c, "slow", n, 50, led.Produced)

	gate := make(chan struct{})
	paused, resumed := make(chan struct{}), make(chan struct{})
	var pausedOnce, resumedOnce sync.Once
	var maxBuffered atomic.Int64
	hook := &pauseHook{
		onPause: func(buffered int) {
			maxBuffered.Store(max(maxBuffered.Load(), int64(buffered)))
			pausedOnce.Do(func() { close(paused) })
		},
		onResume: func(int) { resumedOnce.Do(func() { close(resumed) }) },
	}
	var cons *Consumer
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		for _, p := range cons.Partitions() {
			maxBuffered.Store(max(maxBuffered.Load(), int64(p.Buffered)))
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		led.Handled(r)
		return nil
	})
	cons, err := New(h, append(testOpts(c, "g", "slow"), Ordering(Unordered), Concurrency(8),
		WindowRecords(window), WithHooks(hook))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, paused, 20*time.Second, "the partition to pause")
	ps := cons.Partitions()
	if len(ps) != 1 || !ps[0].Paused || ps[0].Buffered > window || ps[0].InFlight > 8 {
		t.Fatalf("while blocked: %+v; want paused, buffered <= %d, in flight <= 8", ps, window)
	}
	close(gate)
	waitFor(t, resumed, 20*time.Second, "the partition to resume")
	waitFor(t, led.AllHandled(), 30*time.Second, "every record handled")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if ps, lim := cons.Partitions(), cons.ConcurrencyLimit(); ps != nil || lim != 0 {
		t.Errorf("after Run returned: Partitions %+v, ConcurrencyLimit %d; want nil and 0, as documented", ps, lim)
	}
	if err := led.Report().Check(0); err != nil {
		t.Fatal(err)
	}
	if m := maxBuffered.Load(); m > window {
		t.Fatalf("window held %d records; limit %d", m, window)
	}
	t.Logf("max buffered %d (limit %d)", maxBuffered.Load(), window)
}

type pauseHook struct {
	onPause, onResume func(buffered int)
}

func (h *pauseHook) OnPartitionPaused(_ string, _ int32, buffered int)  { h.onPause(buffered) }
func (h *pauseHook) OnPartitionResumed(_ string, _ int32, buffered int) { h.onResume(buffered) }

// TestRebalanceLosesNothing: two members consume, a third joins, then the
// first leaves. Nothing is lost; duplicates stay within what the revoked
// windows could hold. In "runs" the engine takes the handler for tiny, so
// records enter as record runs (run.go) that the rebalances revoke in the
// middle, and every tenth record is slow enough for the stuck guard.
func TestRebalanceLosesNothing(t *testing.T) {
	for _, mode := range []struct {
		name   string
		pinned time.Duration
		slow   int64 // every slow-th record sleeps
	}{{"one-by-one", 0, 1}, {"runs", time.Microsecond, 10}} {
		t.Run(mode.name, func(t *testing.T) {
			const n, parts, window = 20_000, 8, 100
			c := newCluster(t, "rb", parts)
			led := invariant.New(invariant.ByKey, n)
			produce(t, c, "rb", n, 500, led.Produced)

			third, half := make(chan struct{}), make(chan struct{})
			var handled atomic.Int64
			var thirdOnce, halfOnce sync.Once
			h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
				if r.Offset%mode.slow == 0 {
					time.Sleep(50 * time.Microsecond)
				}
				led.Handled(r)
				switch handled.Add(1) {
				case n / 3:
					thirdOnce.Do(func() { close(third) })
				case n / 2:
					halfOnce.Do(func() { close(half) })
				}
				return nil
			})
			var members []*Consumer
			newMember := func() *Consumer {
				cons, err := New(h, append(testOpts(c, "g", "rb"), Concurrency(16), WindowRecords(window), WithHooks(newCommitWatch(led)))...)
				if err != nil {
					t.Fatal(err)
				}
				cons.cfg.pinnedCost = mode.pinned
				members = append(members, cons)
				return cons
			}
			stopA := runConsumer(t, newMember())
			runConsumer(t, newMember())
			waitFor(t, third, 60*time.Second, "a third of the records")
			runConsumer(t, newMember())
			waitFor(t, half, 60*time.Second, "half of the records")
			if err := stopA(); err != nil {
				t.Fatalf("member A: %v", err)
			}
			waitFor(t, led.AllHandled(), 60*time.Second, "every record handled")
			var runs uint64
			for _, m := range members {
				m.last.mu.Lock()
				runs += m.last.runsEntered
				m.last.mu.Unlock()
			}
			if (runs > 0) != (mode.pinned > 0) {
				t.Fatalf("%d record runs entered, pinned cost %v", runs, mode.pinned)
			}
			// Two rebalances revoke at most every partition once each; a
			// revoked partition re-delivers at most its window. Key order
			// holds across the hand-overs.
			rep := led.Report()
			if err := rep.Check(2 * parts * window); err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", rep)
		})
	}
}

// TestCrashRedeliversUnfinishedRecord reproduces the loss scenario of the
// naive design: a slow record at offset 10, fast records above it, and the
// consumer killed (SIGKILL, no graceful path) while the slow one runs. A pool
// committing "the highest finished offset" would have committed 100 and the
// restarted consumer would never see offset 10. kpar committed 10 — the
// window start — so the new consumer gets offset 10 again.
// TestCrashRedeliversOnlyUnfinishedRecord SIGKILLs a consumer whose
// offset 10 never finishes while 11-99 did: the committed offset stays at
// 10, and the commit metadata carries 11-99, so the restarted consumer
// handles offset 10 and nothing else.
func TestCrashRedeliversOnlyUnfinishedRecord(t *testing.T) {
	if os.Getenv("KPAR_CRASH_CHILD") != "" {
		crashChild()
		return
	}
	c := newFakeCluster(t, notPorted, "crash", 1)
	produce(t, c, "crash", 100, 100)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashRedeliversOnlyUnfinishedRecord$")
	cmd.Env = append(os.Environ(), "KPAR_CRASH_CHILD="+strings.Join(c.ListenAddrs(), ","))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child prints "committed 10" once every fast record is done and
	// a commit made after that was acknowledged.
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "committed 10" {
	}
	if sc.Err() != nil || ctx.Err() != nil {
		t.Fatalf("child never reported its commit: %v %v", sc.Err(), ctx.Err())
	}
	cmd.Process.Kill()
	cmd.Wait()

	committed, _ := offsets(t, c, "crash", "crash")
	if committed[0] != 10 {
		t.Fatalf("committed offset %d after the crash; want 10 (the unfinished record)", committed[0])
	}
	var (
		mu      sync.Mutex
		handled []int64
	)
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		mu.Lock()
		handled = append(handled, r.Offset)
		mu.Unlock()
		return nil
	})
	caughtUp := make(chan struct{})
	var once sync.Once
	hook := commitHook(func(offs map[string]map[int32]int64, err error) {
		if err == nil && offs["crash"][0] == 100 {
			once.Do(func() { close(caughtUp) })
		}
	})
	cons, err := New(h, append(testOpts(c, "crash", "crash"), Ordering(Unordered), WithHooks(hook))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, caughtUp, 30*time.Second, "the restarted consumer to commit offset 100")
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != 1 || handled[0] != 10 {
		t.Fatalf("restarted consumer handled offsets %v; want only [10]: 11-99 finished before the crash", handled)
	}
}

// crashChild runs in the child process of
// TestCrashRedeliversOnlyUnfinishedRecord: offset 10 never finishes,
// everything else does.
func crashChild() {
	brokers := strings.Split(os.Getenv("KPAR_CRASH_CHILD"), ",")
	// Print once a commit recorded offset 10 as the start and 11-99 as
	// finished in its metadata.
	var c *Consumer
	committed := make(chan struct{}, 1)
	hook := commitHook(func(offs map[string]map[int32]int64, err error) {
		select {
		case committed <- struct{}{}:
		default:
		}
	})
	go func() {
		for range committed {
			if st := c.Partitions(); len(st) == 1 && st[0].Committed == 10 && st[0].CommittedFinished == 89 {
				fmt.Println("committed 10")
				return
			}
		}
	}()
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if r.Offset == 10 {
			<-ctx.Done() // slow: never finishes before the kill
			return ctx.Err()
		}
		return nil
	})
	cons, err := New(h,
		Brokers(brokers...), Group("crash"), Topics("crash"),
		Ordering(Unordered), CommitInterval(20*time.Millisecond), WithHooks(hook),
		WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
		ClientOptions(kgo.SessionTimeout(2*time.Second), kgo.HeartbeatInterval(100*time.Millisecond)),
	)
	if err != nil {
		panic(err)
	}
	c = cons
	c.Run(context.Background())
}

type commitHook func(map[string]map[int32]int64, error)

func (f commitHook) OnCommit(offs map[string]map[int32]int64, err error) { f(offs, err) }

func TestRunTwiceConcurrentlyFails(t *testing.T) {
	c := newFakeCluster(t, notPorted, "t", 1)
	started := make(chan struct{})
	var once sync.Once
	hook := assignHook(func() { once.Do(func() { close(started) }) })
	cons, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		append(testOpts(c, "g", "t"), WithHooks(hook))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, started, 20*time.Second, "the first Run to join")
	if err := cons.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("first Run: %v", err)
	}
	cons.Close()
	if err := cons.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}
}

type assignHook func()

func (f assignHook) OnPartitionsAssigned(map[string][]int32) { f() }

func TestBatchHandlerGetsOnePartitionInOrder(t *testing.T) {
	const n = 3000
	c := newFakeCluster(t, notPorted, "b", 4)
	led := invariant.New(invariant.ByKey, n)
	produce(t, c, "b", n, 30, led.Produced)
	var bad atomic.Value
	var maxLen atomic.Int64
	h := BatchHandlerFunc(func(_ context.Context, rs []*kgo.Record) error {
		maxLen.Store(max(maxLen.Load(), int64(len(rs))))
		for i, r := range rs {
			if i > 0 && (r.Partition != rs[0].Partition || string(r.Key) != string(rs[0].Key) || r.Offset <= rs[i-1].Offset) {
				bad.Store(fmt.Sprintf("batch mixes records: %s/%d@%d after %s/%d@%d",
					r.Key, r.Partition, r.Offset, rs[i-1].Key, rs[i-1].Partition, rs[i-1].Offset))
			}
			led.Handled(r)
		}
		return nil
	})
	cons, err := NewBatch(h, append(testOpts(c, "g", "b"), BatchSize(50), Concurrency(4))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, led.AllHandled(), 30*time.Second, "every record handled")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	if err := led.Report().Check(0); err != nil {
		t.Fatal(err)
	}
	if maxLen.Load() > 50 || maxLen.Load() < 2 {
		t.Fatalf("largest batch %d; want 2..50", maxLen.Load())
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	h := HandlerFunc(func(context.Context, *kgo.Record) error { return nil })
	base := []ConsumerOpt{Brokers("127.0.0.1:9092"), Group("g"), Topics("t")}
	cases := []struct {
		name string
		opts []ConsumerOpt
		want string
	}{
		{"no brokers", []ConsumerOpt{Group("g"), Topics("t")}, "no brokers"},
		{"no group", []ConsumerOpt{Brokers("127.0.0.1:9092"), Topics("t")}, "no group"},
		{"no topics", []ConsumerOpt{Brokers("127.0.0.1:9092"), Group("g")}, "no topics"},
		{"zero concurrency", append(base, Concurrency(0)), "Concurrency(0) out of range: want 1 to 65536"},
		{"negative concurrency", append(base, Concurrency(-3)), "Concurrency(-3)"},
		{"unknown ordering", append(base, Ordering(Order(9))), "Ordering(9)"},
		{"tiny window", append(base, WindowRecords(2)), "WindowRecords(2) out of range"},
		{"tiny byte budget", append(base, MaxBufferedBytes(10)), "MaxBufferedBytes(10)"},
		{"zero commit interval", append(base, CommitInterval(0)), "CommitInterval(0s)"},
		{"zero shutdown timeout", append(base, ShutdownTimeout(0)), "ShutdownTimeout(0s)"},
		{"negative commit budget", append(base, CommitBudget(-1)), "CommitBudget(-1) out of range"},
		{"zero revoke timeout", append(base, RevokeTimeout(0)), "RevokeTimeout(0s)"},
		{"backoff max below base", append(base, RetryBackoff(time.Second, time.Millisecond)), "RetryBackoff(1s, 1ms)"},
		{"zero attempts", append(base, MaxAttempts(0)), "MaxAttempts(0)"},
		{"zero attempt timeout", append(base, AttemptTimeout(0)), "AttemptTimeout(0s)"},
		{"negative stuck after", append(base, StuckAfter(-time.Second)), "StuckAfter(-1s) out of range: want 0"},
		{"bad retry topic delay", append(base, RetryTopics(time.Second, 0)), "RetryTopics delay 2"},
		{"bad regex", append(base, TopicRegex(), Topics("(")), "TopicRegex"},
		{"nil logger", append(base, WithLogger(nil)), "WithLogger(nil)"},
		{"hook with no methods", append(base, WithHooks(42)), "implements no HookX"},
		{"both brokers and seeds", append(base, ClientOptions(kgo.SeedBrokers("127.0.0.1:9093"))), "both Brokers and ClientOptions"},
		{"group in client options", append(base, ClientOptions(kgo.ConsumerGroup("x"))), "use kpar.Group"},
		{"topics in client options", append(base, ClientOptions(kgo.ConsumeTopics("x"))), "use kpar.Topics"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(h, tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error = %v; want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := New(nil, base...); err == nil {
		t.Fatal("New(nil handler) succeeded")
	}
	if _, err := New(h, append(base, ClientOptions(kgo.ClientID("x")))...); err != nil {
		t.Fatalf("valid options rejected: %v", err)
	}
	bh := BatchHandlerFunc(func(context.Context, []*kgo.Record) error { return nil })
	if _, err := NewBatch(bh, append(base, BatchSize(500), WindowRecords(100))...); err == nil || !strings.Contains(err.Error(), "smaller than BatchSize(500)") {
		t.Fatalf("NewBatch with a window below the batch: %v", err)
	}
	if _, err := New(h, append(base, WindowRecords(50))...); err != nil {
		t.Fatalf("New with a window below the (NewBatch-only) default batch size: %v", err)
	}
	if _, err := New(h, append(base, StuckAfter(0))...); err != nil {
		t.Fatalf("StuckAfter(0), the default, rejected: %v", err)
	}
}

// TestOptionKinds: each option is accepted exactly by the entry points that
// honour it (the table on the option kinds in options.go), so passing one
// where it would be ignored does not compile.
func TestOptionKinds(t *testing.T) {
	const (
		consumer   = 1 << iota // New, NewBatch
		backfill               // Backfill
		member                 // RunMembers
		everywhere = consumer | backfill | member
		flow       = consumer | backfill
		group      = consumer | member
	)
	for name, tc := range map[string]struct {
		o    option
		want int
	}{
		"Brokers": {Brokers(), everywhere}, "ClientOptions": {ClientOptions(), everywhere},
		"Group": {Group("g"), everywhere}, "ShutdownTimeout": {ShutdownTimeout(1), everywhere},
		"RetryBackoff": {RetryBackoff(1, 1), everywhere}, "WithLogger": {WithLogger(nil), everywhere},
		"WithHooks": {WithHooks(), everywhere},
		"Topics":    {Topics(), group}, "TopicRegex": {TopicRegex(), group}, "InstanceID": {InstanceID("i"), group},
		"Concurrency": {Concurrency(1), flow}, "WindowRecords": {WindowRecords(8), flow},
		"MaxBufferedBytes": {MaxBufferedBytes(1), flow}, "AdaptiveConcurrency": {AdaptiveConcurrency(), flow},
		"RateLimit": {RateLimit(1, 1), flow}, "KeyRateLimit": {KeyRateLimit(1, 1), flow},
		"MaxAttempts": {MaxAttempts(1), flow}, "AttemptTimeout": {AttemptTimeout(1), flow},
		"StuckAfter": {StuckAfter(1), flow}, "DeadLetters": {DeadLetters(nil), flow},
		"Ordering": {Ordering(ByKey), consumer}, "BatchSize": {BatchSize(1), consumer},
		"CommitInterval": {CommitInterval(1), consumer}, "CommitMetadataBytes": {CommitMetadataBytes(1), consumer},
		"RevokeTimeout": {RevokeTimeout(1), consumer}, "RetryTopics": {RetryTopics(), consumer},
		"ShareGroup": {ShareGroup("s"), consumer}, "CommitBudget": {CommitBudget(1), consumer},
		"GroupProtocol": {GroupProtocol(ConsumerProtocol), group}, "Outputs": {Outputs(), flow},
		"ExactlyOnce": {ExactlyOnce(), consumer}, "TransactionalID": {TransactionalID("t"), consumer},
		"Readers": {Readers(1), backfill}, "ProgressFile": {ProgressFile("f"), backfill},
		"ProgressInterval": {ProgressInterval(1), backfill},
	} {
		got := 0
		if _, ok := tc.o.(ConsumerOpt); ok {
			got |= consumer
		}
		if _, ok := tc.o.(BackfillOpt); ok {
			got |= backfill
		}
		if _, ok := tc.o.(MemberOpt); ok {
			got |= member
		}
		if got != tc.want {
			t.Errorf("%s is accepted by %03b (consumer, backfill, member from the right); want %03b", name, got, tc.want)
		}
	}
}

// TestOrderText: Order round-trips through its text form, for flag.TextVar.
func TestOrderText(t *testing.T) {
	for _, o := range []Order{ByKey, ByPartition, Unordered} {
		b, err := o.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got Order
		if err := got.UnmarshalText(b); err != nil || got != o || o.String() != string(b) {
			t.Fatalf("%v: text %q, back %v, %v", o, b, got, err)
		}
	}
	var o Order
	if err := o.UnmarshalText([]byte("Key")); err == nil {
		t.Fatal(`UnmarshalText("Key") accepted`)
	}
	if _, err := Order(9).MarshalText(); err == nil || Order(9).String() != "Order(9)" {
		t.Fatalf("Order(9): %v, %q", err, Order(9).String())
	}
}

// TestShutdownIsBoundedByShutdownTimeout runs a handler that ignores its
// context: Run must return within ShutdownTimeout (plus scheduling slack),
// not ShutdownTimeout for the drain, again for the workers and then
// RevokeTimeout when leaving the group.
func TestShutdownIsBoundedByShutdownTimeout(t *testing.T) {
	c := newFakeCluster(t, notPorted, "bounded", 1)
	produce(t, c, "bounded", 10, 10)
	started := make(chan struct{})
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) }) // lets the stray handler go before goleak looks
	var once sync.Once
	h := HandlerFunc(func(context.Context, *kgo.Record) error {
		once.Do(func() { close(started) })
		<-unblock // ignores ctx
		return nil
	})
	cons, err := New(h, append(testOpts(c, "bounded", "bounded"), ShutdownTimeout(time.Second), RevokeTimeout(10*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, started, 10*time.Second, "the handler to start")
	begin := time.Now()
	err = stop()
	took := time.Since(begin)
	if !errors.Is(err, ErrShutdownTimeout) {
		t.Fatalf("Run returned %v, want ErrShutdownTimeout", err)
	}
	if took > 3*time.Second {
		t.Fatalf("Run took %v to return with ShutdownTimeout 1s", took)
	}
}

// TestMembersWithAnotherOrderingAreRefused starts a Key member, then an
// Unordered one in the same group: the second must fail with
// ErrOrderingMismatch instead of breaking per-key order.
func TestMembersWithAnotherOrderingAreRefused(t *testing.T) {
	c := newFakeCluster(t, notPorted, "mixed", 2)
	produce(t, c, "mixed", 10, 10)
	assigned := make(chan struct{})
	var once sync.Once
	first, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		append(testOpts(c, "mixed", "mixed"), Ordering(ByKey), WithHooks(assignHook(func() { once.Do(func() { close(assigned) }) })))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, first)
	waitFor(t, assigned, 10*time.Second, "the first member's assignment")

	second, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		append(testOpts(c, "mixed", "mixed"), Ordering(Unordered))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := second.Run(ctx); !errors.Is(err, ErrOrderingMismatch) {
		t.Fatalf("second member's Run returned %v, want ErrOrderingMismatch", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestFetchErrorsAreLoggedWithBackoff logs a storm of fetch errors through
// the poller's log: one line a second at most, the rest counted.
func TestFetchErrorsAreLoggedWithBackoff(t *testing.T) {
	var n atomic.Int64
	l := fetchErrorLog{log: slog.New(countingHandler{&n})}
	for range 10_000 {
		l.Warn("kpar: fetch error", "err", "UNKNOWN_TOPIC_ID")
	}
	if got := n.Load(); got != 1 {
		t.Fatalf("%d lines for 10,000 errors within a second, want 1", got)
	}
	if l.held != 9_999 {
		t.Fatalf("held back %d, want 9999 (reported with the next line)", l.held)
	}
}
