package kpar

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
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

	"github.com/kpar/kpar/deadletter"
	invariant "github.com/kpar/kpar/internal/ledger"
)

// sinkCase is one dead-letter sink under the behavioural suite: how to make
// it on a cluster, and the URL its letters are read back from.
type sinkCase struct {
	name string
	open func(t *testing.T, c cluster) (deadletter.Sink, string)
}

func sinkCases() []sinkCase {
	return []sinkCase{
		{"kafka", func(t *testing.T, c cluster) (deadletter.Sink, string) {
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Close)
			createTopic(t, c, "poison.dlq", 1)
			return deadletter.NewKafkaSink(cl), "kafka://" + c.ListenAddrs()[0] + "/" + nameIn(c, "poison.dlq")
		}},
		{"file", func(t *testing.T, _ cluster) (deadletter.Sink, string) {
			path := filepath.Join(t.TempDir(), "dlq.jsonl")
			s, err := deadletter.NewFileSink(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s, "file://" + path
		}},
	}
}

// readLetters reads every dead letter back from a sink's URL.
func readLetters(t *testing.T, rawURL string) []deadletter.Letter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	src, err := deadletter.OpenSource(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	var out []deadletter.Letter
	if err := src.Read(ctx, func(l deadletter.Letter) error { out = append(out, l); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// committedTo returns a hook and a channel closed once partition 0 of topic
// has a commit at or past want.
func committedTo(topic string, want int64) (commitHook, <-chan struct{}) {
	ch := make(chan struct{})
	var once sync.Once
	return commitHook(func(offs map[string]map[int32]int64, err error) {
		if err == nil && offs[topic][0] >= want {
			once.Do(func() { close(ch) })
		}
	}), ch
}

// TestPoisonRecordEndsInEachSink: a record that always fails ends in the
// sink exactly once with its fields, and the window moves past it: the
// partition's committed offset reaches the high watermark.
func TestPoisonRecordEndsInEachSink(t *testing.T) {
	for _, sc := range sinkCases() {
		forEachMode(t, sc.name+"/", func(t *testing.T, mode orderMode) {
			const n, poison = 200, 50
			c := newCluster(t, "poison", 1)
			produce(t, c, "poison", n, 10)
			sink, src := sc.open(t, c)

			var attempts atomic.Int64
			h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
				if r.Offset == poison {
					attempts.Add(1)
					return errors.New("cannot parse order")
				}
				return nil
			})
			hook, done := committedTo(c.name("poison"), n)
			cons, err := New(h, append(testOpts(c, "g", "poison"), Ordering(mode.order), MaxAttempts(3), DeadLetters(sink), WithHooks(hook))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			waitFor(t, done, 30*time.Second, "the commit to pass the poison record")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			letters := readLetters(t, src)
			if len(letters) != 1 {
				t.Fatalf("%d dead letters, want 1: %+v", len(letters), letters)
			}
			l := letters[0]
			if l.ID() != fmt.Sprintf("%s/0/%d", c.name("poison"), poison) || l.Class != deadletter.ClassExhausted ||
				l.Attempts != 3 || l.Group != c.name("g") || l.Message != "cannot parse order" {
				t.Fatalf("dead letter %s class %s attempts %d group %q message %q", l.ID(), l.Class, l.Attempts, l.Group, l.Message)
			}
			if l.FirstFailure.IsZero() || l.LastFailure.Before(l.FirstFailure) {
				t.Fatalf("failure times %v .. %v", l.FirstFailure, l.LastFailure)
			}
			if v := decodeValue(l.Record.Value); v.key != poison%10 || string(l.Record.Key) != fmt.Sprintf("key-%d", poison%10) {
				t.Fatalf("dead letter key %q value %+v: not the original", l.Record.Key, v)
			}
			if attempts.Load() != 3 {
				t.Fatalf("poison record tried %d times, want 3", attempts.Load())
			}
		})
	}
}

// recorder collects dead letters and stuck reports from hooks.
type recorder struct {
	mu      sync.Mutex
	letters []deadletter.Letter
	stuck   []int64
	got     chan struct{}
}

func newRecorder() *recorder { return &recorder{got: make(chan struct{}, 100)} }

func (r *recorder) OnDeadLettered(l deadletter.Letter) {
	r.mu.Lock()
	r.letters = append(r.letters, l)
	r.mu.Unlock()
	r.got <- struct{}{}
}

func (r *recorder) OnRecordStuck(_ string, _ int32, offset int64, _ int, _ time.Duration) {
	r.mu.Lock()
	r.stuck = append(r.stuck, offset)
	r.mu.Unlock()
	r.got <- struct{}{}
}

// memSink is a Sink for tests of the engine's classification; the sinks
// themselves are tested in package deadletter and above.
type memSink struct {
	mu      sync.Mutex
	letters []deadletter.Letter
}

func (s *memSink) Write(_ context.Context, ls []deadletter.Letter) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.letters = append(s.letters, ls...)
	return nil
}

// TestFailureClasses: Permanent skips retries; panics and timeouts keep
// their class.
func TestFailureClasses(t *testing.T) {
	cases := []struct {
		name     string
		handler  func(ctx context.Context) error
		class    deadletter.Class
		attempts int
	}{
		{"permanent", func(context.Context) error { return Permanent(errors.New("bad schema")) }, deadletter.ClassPermanent, 1},
		{"exhausted", func(context.Context) error { return errors.New("flaky") }, deadletter.ClassExhausted, 3},
		{"panic", func(context.Context) error { panic("nil map") }, deadletter.ClassPanic, 3},
		{"timeout", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, deadletter.ClassTimeout, 3},
	}
	for _, tc := range cases {
		forEachMode(t, tc.name+"/", func(t *testing.T, mode orderMode) {
			c := newCluster(t, "cls", 1)
			produce(t, c, "cls", 1, 1)
			var calls atomic.Int64
			h := HandlerFunc(func(ctx context.Context, _ *kgo.Record) error {
				calls.Add(1)
				return tc.handler(ctx)
			})
			rec := newRecorder()
			cons, err := New(h, append(testOpts(c, "g", "cls"), Ordering(mode.order), MaxAttempts(3), AttemptTimeout(50*time.Millisecond),
				DeadLetters(&memSink{}), WithHooks(rec))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			select {
			case <-rec.got:
			case <-time.After(20 * time.Second):
				t.Fatal("no dead letter")
			}
			stop()
			rec.mu.Lock()
			defer rec.mu.Unlock()
			l := rec.letters[0]
			if l.Class != tc.class || l.Attempts != tc.attempts || int(calls.Load()) != tc.attempts {
				t.Fatalf("class %s after %d attempts (%d calls); want %s after %d", l.Class, l.Attempts, calls.Load(), tc.class, tc.attempts)
			}
			if tc.class == deadletter.ClassPanic && !containsAll(l.Message, "nil map", "goroutine") {
				t.Fatalf("panic letter lacks the panic and its stack: %q", l.Message)
			}
		})
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestStuckRecordIsReported: a window start that does not move for
// StuckAfter is reported once, with its offset, in every ordering mode (in
// ByKey and ByPartition the records behind it wait too: one key).
func TestStuckRecordIsReported(t *testing.T) {
	forEachMode(t, "", testStuckRecordIsReported)
}

func testStuckRecordIsReported(t *testing.T, mode orderMode) {
	c := newCluster(t, "stuck", 1)
	produce(t, c, "stuck", 20, 1)
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if r.Offset == 7 {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	rec := newRecorder()
	cons, err := New(h, append(testOpts(c, "g", "stuck"), Ordering(mode.order), StuckAfter(100*time.Millisecond),
		AttemptTimeout(20*time.Second), WithHooks(rec))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	select {
	case <-rec.got:
	case <-time.After(20 * time.Second):
		t.Fatal("stuck record not reported")
	}
	close(release)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.stuck) != 1 || rec.stuck[0] != 7 {
		t.Fatalf("stuck reports %v, want [7]", rec.stuck)
	}
}

// TestSinkOutageHoldsTheWindow: while the Kafka dead-letter topic refuses
// writes, no commit passes the poison record and the records not behind it
// go on (in ByKey the other keys, in Unordered all); once it accepts, the
// record is in the DLQ and the window moves on. In every ordering mode.
func TestSinkOutageHoldsTheWindow(t *testing.T) {
	forEachMode(t, "", testSinkOutageHoldsTheWindow)
}

func testSinkOutageHoldsTheWindow(t *testing.T, mode orderMode) {
	t.Parallel() // mostly waits out the sink's backoff
	const n, poison, keys = 100, 10, 5
	c := newFakeCluster(t, "injects produce faults", "out", 1)
	l := invariant.New(mode.check, n)
	produce(t, c, "out", n, keys, l.Produced)
	// One partition: record i is at offset i, with key i%keys. What may
	// finish while the poison record waits for the sink:
	healthy := int64(0)
	for i := range n {
		switch {
		case i == poison:
		case i < poison, mode.order == Unordered, mode.order == ByKey && i%keys != poison%keys:
			healthy++
		}
	}
	createTopic(t, c, "out.dlq", 1)
	outage := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out.dlq", Err: kerr.NotLeaderForPartition, Count: -1})

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RecordDeliveryTimeout(time.Second), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var handled atomic.Int64
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		if r.Offset == poison {
			return Permanent(errors.New("poison"))
		}
		l.Handled(r)
		handled.Add(1)
		return nil
	})
	watch := newOutageWatch("out")
	done, doneCh := committedTo("out", n)
	cons, err := New(h, append(testOpts(c, "g", "out"), Ordering(mode.order), RetryBackoff(10*time.Millisecond, 50*time.Millisecond),
		DeadLetters(deadletter.NewKafkaSink(cl)), WithHooks(watch, done, newCommitWatch(l)))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	// Several failed writes while every other record completes.
	for range 3 {
		watch.waitFailedWrite(t, "the sink outage was never hit")
	}
	for handled.Load() < healthy {
		watch.waitFailedWrite(t, fmt.Sprintf("only %d of %d healthy records handled during the outage", handled.Load(), healthy))
	}
	watch.waitFailedWrite(t, "the sink outage ended by itself")
	if got := handled.Load(); got != healthy {
		t.Fatalf("%d records handled during the outage, want the %d not behind the poison record", got, healthy)
	}
	if during := watch.committed(); during > poison {
		t.Fatalf("committed %d during the outage, past the unfinished offset %d", during, poison)
	}
	outage.Remove()
	waitFor(t, doneCh, 20*time.Second, "the commit to pass the poison record after the outage")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	letters := readLetters(t, "kafka://"+c.ListenAddrs()[0]+"/out.dlq")
	if len(letters) != 1 || letters[0].Record.Offset != poison {
		t.Fatalf("dead letters after the outage: %d, want the one at %d", len(letters), poison)
	}
	if err := l.Report().Check(0); err != nil {
		t.Fatal(err)
	}
}

// outageWatch observes a consumer through a sink outage: the highest offset
// committed for partition 0 of its topic, and each failed sink write.
type outageWatch struct {
	topic  string
	failed chan struct{}

	mu        sync.Mutex
	maxCommit int64
}

func newOutageWatch(topic string) *outageWatch {
	return &outageWatch{topic: topic, failed: make(chan struct{}, 100), maxCommit: -1}
}

func (w *outageWatch) OnCommit(offs map[string]map[int32]int64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if o, ok := offs[w.topic][0]; ok && err == nil {
		w.maxCommit = max(w.maxCommit, o)
	}
}

func (w *outageWatch) OnDeadLetterFailed(int, error) {
	select {
	case w.failed <- struct{}{}:
	default:
	}
}

func (w *outageWatch) committed() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxCommit
}

// waitFailedWrite waits for the next failed sink write; failing with msg
// after 20s.
func (w *outageWatch) waitFailedWrite(t *testing.T, msg string) {
	t.Helper()
	select {
	case <-w.failed:
	case <-time.After(20 * time.Second):
		t.Fatal(msg)
	}
}

// TestRetryTopicTooLargeGoesToTheDeadLetters: a failed record its retry
// topic refuses as too large (max.message.bytes) goes to the dead letters,
// saying why, instead of holding its partition's commits for ever; the
// records behind it are committed.
func TestRetryTopicTooLargeGoesToTheDeadLetters(t *testing.T) {
	const n, big = 10, 3
	c := newCluster(t, "rtbig", 1)
	topic := nameIn(c, "rtbig")
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	maxBytes := "4096"
	if _, err := kadm.NewClient(cl).CreateTopic(t.Context(), 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, RetryTopic(topic, 1)); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range n {
		v := fmt.Appendf(nil, "v%d", i)
		if i == big {
			v = make([]byte, 16<<10) // random: compressed, it stays too large
			rand.Read(v)
		}
		recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: v})
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	sink := &signalSink{got: make(chan struct{})}
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		if r.Offset == big {
			return errors.New("downstream busy")
		}
		return nil
	})
	cons, err := New(h, append(testOpts(c, "g", "rtbig"), MaxAttempts(1), RetryTopics(time.Minute), DeadLetters(sink))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, sink.got, 30*time.Second, "the dead letter of the record too large for its retry topic")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.letters) != 1 || sink.letters[0].Record.Offset != big {
		t.Fatalf("dead letters %v, want offset %d alone", sink.letters, big)
	}
	if msg := sink.letters[0].Message; !strings.Contains(msg, "downstream busy") || !strings.Contains(msg, "refused it as too large") {
		t.Errorf("dead letter message %q, want the handler's error and the retry topic's refusal", msg)
	}
	if committed, _ := offsets(t, c, "g", "rtbig"); committed[0] != n {
		t.Errorf("committed %d, want %d: the partition stalled behind the refused record", committed[0], n)
	}
}

// signalSink is a memSink that closes got at its first write.
type signalSink struct {
	memSink
	got  chan struct{}
	once sync.Once
}

func (s *signalSink) Write(ctx context.Context, ls []deadletter.Letter) error {
	err := s.memSink.Write(ctx, ls)
	s.once.Do(func() { close(s.got) })
	return err
}

// TestRetryTopicDelaysWithoutBlocking: a record that fails its local
// attempts goes to <topic>.retry.1 and is handled from there no earlier
// than its due time, while the records behind it in its partition are not
// held back: those of its own key included, in every mode. A record in a
// retry topic leaves its key's (and partition's) order, as Spring Kafka's
// non-blocking retries do; the docs of RetryTopics and ByKey say so.
func TestRetryTopicDelaysWithoutBlocking(t *testing.T) {
	forEachMode(t, "", testRetryTopicDelaysWithoutBlocking)
}

func testRetryTopicDelaysWithoutBlocking(t *testing.T, mode orderMode) {
	const n, flaky = 50, 3
	const delay = 700 * time.Millisecond
	c := newCluster(t, "rt", 1)
	var flakyKey []byte
	produce(t, c, "rt", n, 5, func(r *kgo.Record) {
		if r.Offset == flaky {
			flakyKey = r.Key
		}
	})

	var (
		mu        sync.Mutex
		failedAt  time.Time
		retriedAt time.Time
		calls     int
		others    int
		othersAt  time.Time
		sameKeyAt time.Time // a later record of the flaky record's key finished
	)
	done := make(chan struct{})
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		if r.Offset != flaky {
			if r.Offset > flaky && bytes.Equal(r.Key, flakyKey) && sameKeyAt.IsZero() {
				sameKeyAt = time.Now()
			}
			others++
			if others == n-1 {
				othersAt = time.Now()
			}
			return nil
		}
		calls++
		if calls <= 2 {
			failedAt = time.Now()
			return errors.New("downstream busy")
		}
		if r.Topic != c.name("rt") || r.Partition != 0 {
			t.Errorf("retried record shows as %s/%d, want the original %s/0", r.Topic, r.Partition, c.name("rt"))
		}
		retriedAt = time.Now()
		close(done)
		return nil
	})
	cons, err := New(h, append(testOpts(c, "g", "rt"), Ordering(mode.order), MaxAttempts(2),
		RetryTopics(delay), DeadLetters(&memSink{}))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, done, 30*time.Second, "the retried record")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if early := failedAt.Add(delay).Sub(retriedAt); early > 5*time.Millisecond { // due times are in ms
		t.Fatalf("retried %v before its due time", early)
	}
	if othersAt.IsZero() || !othersAt.Before(failedAt.Add(delay)) {
		t.Fatalf("other records finished at %v, not before the retry was due (%v): they were held back", othersAt, failedAt.Add(delay))
	}
	if calls != 3 {
		t.Fatalf("flaky record called %d times, want 3", calls)
	}
	if sameKeyAt.IsZero() || !sameKeyAt.Before(retriedAt) {
		t.Fatalf("no later record of the retried record's key finished before its retry (at %v, retried at %v): a retry topic must not hold its key", sameKeyAt, retriedAt)
	}
}

// TestRetriesDoNotStarveHealthyPartitions: records waiting for retries do
// not count against MaxBufferedBytes, and those queued behind them in their
// key's or partition's lane pause only their own partition once the budget
// is full, so a partition whose records all fail cannot stop the fetching
// of a healthy one, in any ordering mode.
func TestRetriesDoNotStarveHealthyPartitions(t *testing.T) {
	forEachMode(t, "", testRetriesDoNotStarveHealthyPartitions)
}

func testRetriesDoNotStarveHealthyPartitions(t *testing.T, mode orderMode) {
	const failing, healthy = 200, 2000
	c := newCluster(t, "mixed", 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for i := range failing + healthy {
		r := &kgo.Record{Topic: c.name("mixed"), Partition: 1, Value: make([]byte, 10<<10)}
		if i < failing {
			// One key: in ByKey too, the records behind the first
			// failing one queue in its lane.
			r.Partition, r.Key = 0, []byte("down")
		}
		recs = append(recs, r)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()

	var ok atomic.Int64
	done := make(chan struct{})
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		if r.Partition == 0 {
			return errors.New("downstream of partition 0 is down")
		}
		if ok.Add(1) == healthy {
			close(done)
		}
		return nil
	})
	// 1 MiB holds ~100 records: half of partition 0's failing ones, and
	// the healthy partition needs several fetches.
	cons, err := New(h, append(testOpts(c, "g", "mixed"), Ordering(mode.order), MaxBufferedBytes(1<<20),
		RetryBackoff(50*time.Millisecond, 200*time.Millisecond), ShutdownTimeout(100*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, done, 30*time.Second, "every record of the healthy partition")
	stop()
}

// TestRetriesKeepOrderInEveryMode fails 10% of first attempts (some by
// panicking) in every ordering mode: nothing is lost, and in ByKey and
// ByPartition a record's first success never overtakes an earlier record
// of its key or partition, retried ones included (internal/ledger checks).
func TestRetriesKeepOrderInEveryMode(t *testing.T) {
	forEachMode(t, "", func(t *testing.T, mode orderMode) {
		c, l := newOrderCheck(t, "order", mode)
		var tries sync.Map // "p/offset" -> attempts so far
		h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
			k := fmt.Sprintf("%d/%d", r.Partition, r.Offset)
			v, _ := tries.LoadOrStore(k, new(atomic.Int64))
			if v.(*atomic.Int64).Add(1) == 1 {
				switch r.Offset % 20 {
				case 3:
					return errors.New("downstream hiccup")
				case 11:
					panic("bad luck")
				}
			}
			l.Handled(r)
			return nil
		})
		cons, err := New(h, append(testOpts(c, "g", "order"), Ordering(mode.order), MaxAttempts(5),
			WithHooks(newCommitWatch(l)))...)
		if err != nil {
			t.Fatal(err)
		}
		runChecked(t, cons, l)
	})
}

// newOrderCheck starts a cluster whose topic of 4 partitions holds 3,000
// records of 40 keys, each produced into l, a ledger checking mode's order:
// the retries-keep-order tests' backlog.
func newOrderCheck(t *testing.T, topic string, mode orderMode) (c *testCluster, l *invariant.Ledger) {
	t.Helper()
	const n, keys = 3000, 40
	c = newCluster(t, topic, 4)
	l = invariant.New(mode.check, n)
	produce(t, c, topic, n, keys, l.Produced)
	return c, l
}

// runChecked runs cons until l saw every record handled, stops it, and
// fails the test on any record lost or repeated, out of order, or committed
// past.
func runChecked(t *testing.T, cons *Consumer, l *invariant.Ledger) {
	t.Helper()
	stop := runConsumer(t, cons)
	waitFor(t, l.AllHandled(), 60*time.Second, "every record handled")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := l.Report().Check(0); err != nil {
		t.Fatal(err)
	}
}

// forEachMode runs test as a subtest per ordering mode, named prefix and
// the mode: one behavioural suite over the three modes.
func forEachMode(t *testing.T, prefix string, test func(t *testing.T, mode orderMode)) {
	t.Helper()
	for _, mode := range orderModes() {
		t.Run(prefix+mode.order.String(), func(t *testing.T) { test(t, mode) })
	}
}

// TestBatchRetriesKeepOrderInEveryMode is TestRetriesKeepOrderInEveryMode
// for the batch handler: a failed batch is retried, and in ByKey and
// ByPartition no record's first success overtakes an earlier record of its
// key or partition.
func TestBatchRetriesKeepOrderInEveryMode(t *testing.T) {
	forEachMode(t, "", func(t *testing.T, mode orderMode) {
		c, l := newOrderCheck(t, "border", mode)
		var batches atomic.Int64
		h := BatchHandlerFunc(func(_ context.Context, rs []*kgo.Record) error {
			if batches.Add(1)%10 == 3 {
				return errors.New("downstream hiccup")
			}
			for _, r := range rs {
				l.Handled(r)
			}
			return nil
		})
		cons, err := NewBatch(h, append(testOpts(c, "g", "border"), Ordering(mode.order), MaxAttempts(5), BatchSize(20),
			Concurrency(8), WithHooks(newCommitWatch(l)))...)
		if err != nil {
			t.Fatal(err)
		}
		runChecked(t, cons, l)
	})
}
