package kpar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	invariant "github.com/kpar/kpar/internal/ledger"
)

// virtualCluster starts a kfake broker on kfake's in-process network, so
// that a consumer in a synctest bubble runs in virtual time: clients must
// dial with the returned option. Call inside the bubble.
func virtualCluster(t *testing.T, topic string, partitions int32) (*kfake.Cluster, kgo.Opt) {
	t.Helper()
	var stack kfake.VirtualNetwork
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(19092), kfake.ListenFn(stack.Listen),
		kfake.SeedTopics(partitions, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, kgo.Dialer(stack.DialContext)
}

// produceKeys writes one record per key in keys, in order, to topic.
func produceKeys(t *testing.T, c *kfake.Cluster, dial kgo.Opt, topic string, keys []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), dial, kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var rs []*kgo.Record
	for i, k := range keys {
		rs = append(rs, &kgo.Record{Key: []byte(k), Value: fmt.Appendf(nil, "%d", i)})
	}
	if err := cl.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// startLog records when each attempt started, by key.
type startLog struct {
	mu     sync.Mutex
	starts []time.Time
	byKey  map[string][]time.Time
	values map[string][]string
	done   map[string]bool
}

func newStartLog() *startLog {
	return &startLog{byKey: map[string][]time.Time{}, values: map[string][]string{}, done: map[string]bool{}}
}

func (l *startLog) start(r *kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.starts = append(l.starts, now)
	l.byKey[string(r.Key)] = append(l.byKey[string(r.Key)], now)
	l.values[string(r.Key)] = append(l.values[string(r.Key)], string(r.Value))
}

func (l *startLog) success(r *kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done[fmt.Sprint(r.Partition, "/", r.Offset)] = true
}

func (l *startLog) handled() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.done)
}

// virtualOpts are testOpts for a virtual cluster.
func virtualOpts(c *kfake.Cluster, dial kgo.Opt, topic string) []ConsumerOpt {
	return append(testOpts(c, "g", topic), ClientOptions(dial))
}

// waitHandled waits, in virtual time, until n distinct records were
// handled, for at most limit.
func waitHandled(t *testing.T, l *startLog, n int, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for l.handled() < n {
		if time.Since(start) > limit {
			t.Fatalf("%d of %d records handled after %v", l.handled(), n, limit)
		}
		time.Sleep(10 * time.Millisecond) // virtual
	}
	return time.Since(start)
}

// runVirtual runs a consumer of topic on a virtual cluster with h and
// opts (on top of virtualOpts) until the test ends or stop is called.
func runVirtual(t *testing.T, c *kfake.Cluster, dial kgo.Opt, topic string, h Handler, opts ...ConsumerOpt) (cons *Consumer, stop func() error) {
	t.Helper()
	cons, err := New(h, append(virtualOpts(c, dial, topic), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cons, runConsumer(t, cons)
}

// handleVirtual runs a consumer as runVirtual does until l has n records
// handled (within limit, in virtual time), then stops it.
func handleVirtual(t *testing.T, c *kfake.Cluster, dial kgo.Opt, topic string, l *startLog, n int, limit time.Duration, h Handler, opts ...ConsumerOpt) *Consumer {
	t.Helper()
	cons, stop := runVirtual(t, c, dial, topic, h, opts...)
	waitHandled(t, l, n, limit)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return cons
}

// hotAndCold are the keys of 2n records: key hot every other record,
// between them cold0, cold1, ... each once.
func hotAndCold(n int) []string {
	var keys []string
	for i := range n {
		keys = append(keys, "hot", fmt.Sprint("cold", i))
	}
	return keys
}

// checkHotSpaced fails the test unless the hot key started n times, each
// start at least 99ms after the one before (its limit is 10 a second).
func checkHotSpaced(t *testing.T, l *startLog, n int) []time.Time {
	t.Helper()
	hot := l.byKey["hot"]
	if len(hot) != n {
		t.Fatalf("hot key started %d times, want %d (no retries)", len(hot), n)
	}
	for i := 1; i < len(hot); i++ {
		if gap := hot[i].Sub(hot[i-1]); gap < 99*time.Millisecond {
			t.Fatalf("hot key starts %d and %d %v apart, want 100ms (10 a second)", i-1, i, gap)
		}
	}
	return hot
}

// TestRateLimitSpacesStarts: 300 records under RateLimit(100, 10) start no
// more than 110 in any second and take about 2.9 s of virtual time (the
// burst of 10 at once, then 100 a second), with retries counted as starts.
func TestRateLimitSpacesStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, dial := virtualCluster(t, "rate", 4)
		keys := make([]string, 300)
		for i := range keys {
			keys[i] = fmt.Sprint("k", i)
		}
		produceKeys(t, c, dial, "rate", keys)
		l := newStartLog()
		var failedOnce sync.Map
		h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
			l.start(r)
			if r.Offset%10 == 0 {
				if _, again := failedOnce.LoadOrStore(fmt.Sprint(r.Partition, r.Offset), true); !again {
					return errors.New("fail once") // its retry is a start too
				}
			}
			l.success(r)
			return nil
		})
		cons := handleVirtual(t, c, dial, "rate", l, 300, time.Minute, h, Ordering(Unordered), RateLimit(100, 10))
		l.mu.Lock()
		defer l.mu.Unlock()
		starts := len(l.starts)
		if starts <= 300 {
			t.Fatalf("%d starts for 300 records, want the retries on top", starts)
		}
		if m := invariant.MaxInWindow(l.starts, time.Second); m > 110 {
			t.Errorf("%d starts within one second, want at most 110 (rate 100, burst 10)", m)
		}
		// (starts - burst) / rate from the first start to the last.
		took := l.starts[len(l.starts)-1].Sub(l.starts[0])
		want := time.Duration(float64(starts-10) / 100 * float64(time.Second))
		if took < want-20*time.Millisecond || took > want+200*time.Millisecond {
			t.Errorf("%d starts took %v, want about %v", starts, took, want)
		}
		if got := cons.RateLimits(); got.PerSecond != 100 || got.Burst != 10 || got.KeyPerSecond != 0 {
			t.Errorf("RateLimits %+v, want rate 100, burst 10, no key limit", got)
		}
	})
}

// TestKeyRateLimitHoldsOnlyItsKey: in key mode a hot key limited to 10 a
// second waits while the other keys go on at once, and its records keep
// their order.
func TestKeyRateLimitHoldsOnlyItsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, dial := virtualCluster(t, "keys", 1)
		produceKeys(t, c, dial, "keys", hotAndCold(20))
		l := newStartLog()
		h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
			l.start(r)
			l.success(r)
			return nil
		})
		cons, stop := runVirtual(t, c, dial, "keys", h, Ordering(ByKey), KeyRateLimit(10, 1))
		took := waitHandled(t, l, 40, time.Minute)
		if lim := cons.RateLimits(); lim.KeyPerSecond != 10 || lim.KeyBurst != 1 || lim.Keys < 1 || lim.Keys > keyBuckets {
			t.Errorf("RateLimits %+v, want key rate 10, burst 1, 1 or more keys", lim)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		hot := checkHotSpaced(t, l, 20)
		if !slices.IsSortedFunc(l.values["hot"], func(a, b string) int {
			x, _ := strconv.Atoi(a)
			y, _ := strconv.Atoi(b)
			return x - y
		}) {
			t.Errorf("hot key out of order: %v", l.values["hot"])
		}
		var lastCold time.Time
		for k, ts := range l.byKey {
			if k != "hot" && ts[0].After(lastCold) {
				lastCold = ts[0]
			}
		}
		if d := lastCold.Sub(hot[0]); d > 500*time.Millisecond {
			t.Errorf("the cold keys finished %v after the first hot start: they waited for the hot key", d)
		}
		if took < 1900*time.Millisecond {
			t.Errorf("took %v, want at least 1.9s for 20 starts of one key at 10 a second", took)
		}
	})
}

// countLevels counts log records by level and by message.
type countLevels struct {
	mu   sync.Mutex
	n    map[slog.Level]int
	msgs map[string]int
}

func (h *countLevels) Enabled(context.Context, slog.Level) bool { return true }
func (h *countLevels) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n[r.Level]++
	h.msgs[r.Message]++
	return nil
}
func (h *countLevels) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countLevels) WithGroup(string) slog.Handler      { return h }

// TestOutageDeadLettersNothing: with the default options a downstream that
// answers every attempt Overloaded for 30 s (in virtual time) dead-letters
// nothing, is probed a few times a second at most after the breaker opens,
// and the outage takes a handful of warnings, not one per attempt.
func TestOutageDeadLettersNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 400
		c, dial := virtualCluster(t, "outage", 4)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprint("k", i%50)
		}
		produceKeys(t, c, dial, "outage", keys)
		l := newStartLog()
		begin := time.Now()
		var mu sync.Mutex
		var during []time.Time // attempts during the outage
		h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
			time.Sleep(time.Millisecond) // a 503's round trip
			if since := time.Since(begin); since < 30*time.Second {
				mu.Lock()
				during = append(during, time.Now())
				mu.Unlock()
				return Overloaded(errors.New("503 Service Unavailable"))
			}
			l.start(r)
			l.success(r)
			return nil
		})
		logs := &countLevels{n: map[slog.Level]int{}, msgs: map[string]int{}}
		sink := &memSink{}
		handleVirtual(t, c, dial, "outage", l, n, 2*time.Minute, h, DeadLetters(sink), WithLogger(slog.New(logs)),
			RetryBackoff(100*time.Millisecond, 10*time.Second), MaxAttempts(3))
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if len(sink.letters) != 0 {
			t.Fatalf("%d healthy records dead-lettered during the outage", len(sink.letters))
		}
		mu.Lock()
		defer mu.Unlock()
		late := 0
		for _, at := range during {
			if at.Sub(begin) > 2*time.Second {
				late++
			}
		}
		// Pauses double from 100ms to 5s: about a dozen probes in 28s.
		if late > 30 {
			t.Errorf("%d attempts in the outage's last 28s, want probes only (about a dozen)", late)
		}
		logs.mu.Lock()
		defer logs.mu.Unlock()
		if w := logs.n[slog.LevelWarn]; w > 6 {
			t.Errorf("%d warnings for %d failed attempts, want a summary (at most 6)", w, len(during))
		}
		if n := logs.msgs["kpar: handler failed"]; n != 0 {
			t.Errorf("%d per-attempt warnings, want none: overload is summarised", n)
		}
		if n := logs.msgs["kpar: downstream recovered: attempts succeed again"]; n != 1 {
			t.Errorf("recovery logged %d times, want once", n)
		}
		t.Logf("%d attempts during the outage, %d after its first 2s; %d warnings", len(during), late, logs.n[slog.LevelWarn])
	})
}

func TestRateLimitValidation(t *testing.T) {
	c := newCluster(t, "v", 1)
	for _, tc := range []struct {
		opt  ConsumerOpt
		want string
	}{
		{RateLimit(0, 1), "RateLimit(0, 1): perSecond out of range"},
		{RateLimit(-5, 1), "RateLimit(-5, 1): perSecond out of range"},
		{RateLimit(math.NaN(), 1), "perSecond out of range"},
		{RateLimit(math.Inf(1), 1), "perSecond out of range"},
		{RateLimit(10, 0), "RateLimit(10, 0): burst out of range: want 1 or more"},
		{KeyRateLimit(0, 1), "KeyRateLimit(0, 1): perSecond out of range"},
		{KeyRateLimit(1, -1), "KeyRateLimit(1, -1): burst out of range"},
	} {
		_, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { return nil }), append(testOpts(c, "g", "v"), tc.opt)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one containing %q", err, tc.want)
		}
	}
	if _, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		append(testOpts(c, "g", "v"), RateLimit(0.5, 1), KeyRateLimit(1000, 50))...); err != nil {
		t.Errorf("valid limits refused: %v", err)
	}
	_, err := Backfill(t.Context(), HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		Range{Topic: "v", From: AtOffset(0), To: AtOffset(1)}, Brokers(c.ListenAddrs()...), RateLimit(0, 1))
	if err == nil || !strings.Contains(err.Error(), "perSecond out of range") {
		t.Errorf("Backfill with RateLimit(0, 1): %v, want it refused as New refuses it", err)
	}
}

// TestKeyRateLimitOtherOrders: in partition mode a limited key holds its
// partition (records still start in offset order); in unordered mode the
// records of one key, ready at once, each reserve a token and start spaced
// out at the key's rate, not all together.
func TestKeyRateLimitOtherOrders(t *testing.T) {
	for _, o := range []Order{ByPartition, Unordered} {
		t.Run(o.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, dial := virtualCluster(t, "orders", 1)
				produceKeys(t, c, dial, "orders", hotAndCold(10))
				l := newStartLog()
				var mu sync.Mutex
				var offsets []int64
				h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
					l.start(r)
					mu.Lock()
					offsets = append(offsets, r.Offset)
					mu.Unlock()
					l.success(r)
					return nil
				})
				handleVirtual(t, c, dial, "orders", l, 20, time.Minute, h, Ordering(o), KeyRateLimit(10, 1))
				l.mu.Lock()
				defer l.mu.Unlock()
				checkHotSpaced(t, l, 10)
				mu.Lock()
				defer mu.Unlock()
				if o == ByPartition && !slices.IsSorted(offsets) {
					t.Errorf("partition mode started records out of offset order: %v", offsets)
				}
			})
		})
	}
}
