package kpar

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
	invariant "github.com/kpar/kpar/internal/ledger"
)

// The conformance suite: one table of flow rules (rows) run on every way
// kpar consumes (columns: flowSources in conformance_helpers_test.go), as
// watermill's pubsub/tests runs one suite over every Pub/Sub. A rule added
// later adds one row and runs on every source. Each cell is the subtest
// TestConformance/<row>/<source>.

// knownFailures are the cells that fail today, keyed "row/source", each
// with what goes wrong. A known cell is skipped, saying why, unless
// KPAR_CONFORMANCE_KNOWN=1: then it runs, and is expected to fail; one
// that passes fails, asking for its entry to be deleted. Delete an entry
// when its source moves onto the pipeline that gets the rule right.
var knownFailures = map[string]string{}

// acceptedRefusals are the cells, keyed "row/source", where the source
// may refuse the row's options at start with an error (New's or
// Backfill's) instead of honouring them: the cell then passes as
// refused. Issue 28 wants every rule honoured everywhere, so none is
// listed; a rule that truly cannot apply to a source would be.
var acceptedRefusals = map[string]bool{}

// knownEnv runs the known failures too.
const knownEnv = "KPAR_CONFORMANCE_KNOWN"

// flowRow is one rule: a test run on one source.
type flowRow struct {
	name string
	test func(t *testing.T, src flowSource)
}

func flowRows() []flowRow {
	return []flowRow{
		{"outage", testOutage},
		{"misconfigured", testMisconfigured},
		{"hung-record", testHungRecord},
		{"hanging-outage", testHangingOutage},
		{"rate-limit", testRateLimit},
		{"key-rate-limit", testKeyRateLimit},
		{"adaptive", testAdaptive},
		{"dead-letter", testRetriesThenDeadLetter},
		{"permanent", testPermanent},
		{"stuck", testStuck},
		{"shutdown", testShutdownBound},
		{"shutdown-ctx-ignored", testShutdownBoundCtxIgnored},
		{"poison-storm", testPoisonStorm},
		{"order", testOrder},
		{"outputs", testOutputs},
		{"max-buffered-bytes", testMaxBufferedBytes},
	}
}

func TestConformance(t *testing.T) {
	runKnown := os.Getenv(knownEnv) == "1"
	for _, row := range flowRows() {
		t.Run(row.name, func(t *testing.T) {
			for _, src := range flowSources() {
				t.Run(src.name, func(t *testing.T) {
					name := row.name + "/" + src.name
					why, known := knownFailures[name]
					if known && !runKnown {
						t.Skipf("known failure (%s=1 runs it): %s", knownEnv, why)
					}
					t.Parallel()
					if known {
						t.Cleanup(func() {
							if !t.Failed() && !t.Skipped() {
								t.Errorf("%s passes now: delete its knownFailures entry (%q)", name, why)
							}
						})
					}
					row.test(t, src)
				})
			}
		})
	}
}

// TestConformanceKnownFailuresNameCells: every knownFailures and
// acceptedRefusals entry names a cell of the table, so that renaming a row
// or source cannot leave a stale entry behind.
func TestConformanceKnownFailuresNameCells(t *testing.T) {
	cells := map[string]bool{}
	for _, row := range flowRows() {
		for _, src := range flowSources() {
			cells[row.name+"/"+src.name] = true
		}
	}
	for name, why := range knownFailures {
		if !cells[name] {
			t.Errorf("knownFailures[%q] names no cell of the table", name)
		}
		if why == "" {
			t.Errorf("knownFailures[%q] gives no reason", name)
		}
	}
	for name := range acceptedRefusals {
		if !cells[name] {
			t.Errorf("acceptedRefusals[%q] names no cell of the table", name)
		}
	}
}

var errUnavailable = errors.New("503 Service Unavailable")

// flowGate is a downstream that is down until opened.
type flowGate struct {
	open chan struct{}
	once sync.Once
}

func newFlowGate() *flowGate { return &flowGate{open: make(chan struct{})} }

// downUntil is a downstream that fails every attempt with fail until
// failures such attempts were seen (enough is then closed), and from then
// on handles each record into its ledger: an outage that ends by itself,
// or when the cell does.
type downUntil struct {
	Handler
	failed atomic.Int64
	enough chan struct{}
}

func newDownUntil(cl *cell, l *invariant.Ledger, failures int64, fail error) *downUntil {
	d := &downUntil{enough: make(chan struct{})}
	gate := newFlowGate()
	d.Handler = HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		if !gate.up() {
			if d.failed.Add(1) == failures {
				close(d.enough)
			}
			return fail
		}
		l.Handled(r)
		return nil
	})
	go func() {
		select {
		case <-d.enough:
		case <-cl.done.Done():
		}
		gate.openNow()
	}()
	return d
}
func (g *flowGate) up() bool {
	select {
	case <-g.open:
		return true
	default:
		return false
	}
}
func (g *flowGate) openNow() { g.once.Do(func() { close(g.open) }) }

// testOutage: a downstream that answers Overloaded to every attempt until
// 40 such failures were seen burns no attempt: with MaxAttempts(1),
// nothing is dead-lettered and every record is handled once it is back.
func testOutage(t *testing.T, src flowSource) {
	const n, failures = 200, 40
	cl := newCell(t, src, n, func(i int) int { return i % 20 })
	l := cl.produced(invariant.Unordered)
	d := newDownUntil(cl, l, failures, Overloaded(errUnavailable))
	sink := &memSink{}
	if !cl.mustRun(d, MaxAttempts(1), DeadLetters(sink)) {
		return
	}
	select {
	case <-d.enough:
	default:
		t.Fatalf("only %d overloaded attempts before the bound, want %d", d.failed.Load(), failures)
	}
	if dead := lettersByIndex(sink); len(dead) > 0 {
		t.Errorf("%d of %d records dead-lettered for the downstream's overload (%d overloaded attempts), first %s",
			len(dead), n, d.failed.Load(), cl.describe(firstKeys(dead, 1)[0]))
	}
	if rep := l.Report(); rep.Handled != n {
		t.Errorf("%d of %d records handled (%d dead-lettered): %s", rep.Handled, n, cl.fin.deadLettered(), cl.unfinished())
	}
}

// startSpan is the time from the first of ts to the last.
func startSpan(ts []time.Time) time.Duration {
	ts = slices.SortedFunc(slices.Values(ts), time.Time.Compare)
	return ts[len(ts)-1].Sub(ts[0])
}

// atLeastSpan is the least time n starts at perSecond (burst 1) take from
// the first to the last, less 10% for timer slack. Only a lower bound: a
// loaded machine makes a run slower, never faster.
func atLeastSpan(n int, perSecond float64) time.Duration {
	return time.Duration(float64(n-1) / perSecond * 0.9 * float64(time.Second))
}

// runLoggingStarts runs a handler that notes when each attempt starts and
// succeeds, with opt; ran is mustRun's.
func runLoggingStarts(cl *cell, opt FlowOpt) (sl *startLog, ran bool) {
	cl.t.Helper()
	sl = newStartLog()
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		sl.start(r)
		return nil
	})
	return sl, cl.mustRun(h, opt)
}

// testRateLimit: RateLimit(r, 1) spaces the starts of attempts, all
// records together, at r a second.
func testRateLimit(t *testing.T, src flowSource) {
	const n, rate = 30, 40.0
	cl := newCell(t, src, n, func(i int) int { return i })
	sl, ran := runLoggingStarts(cl, RateLimit(rate, 1))
	if !ran {
		return
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if len(sl.starts) < n {
		t.Fatalf("%d starts for %d records: %s", len(sl.starts), n, cl.unfinished())
	}
	if got, want := startSpan(sl.starts), atLeastSpan(len(sl.starts), rate); got < want {
		t.Errorf("%d starts took %v from the first to the last, want at least %v at %v a second (RateLimit not honoured)",
			len(sl.starts), got.Round(time.Millisecond), want.Round(time.Millisecond), rate)
	}
}

// testKeyRateLimit: KeyRateLimit(r, 1) spaces the starts of each key's
// attempts at r a second.
func testKeyRateLimit(t *testing.T, src flowSource) {
	const keys, perKey, rate = 3, 10, 20.0
	cl := newCell(t, src, keys*perKey, func(i int) int { return i % keys })
	sl, ran := runLoggingStarts(cl, KeyRateLimit(rate, 1))
	if !ran {
		return
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if len(sl.byKey) != keys {
		t.Fatalf("starts of %d keys, want %d: %s", len(sl.byKey), keys, cl.unfinished())
	}
	for k, ts := range sl.byKey {
		if got, want := startSpan(ts), atLeastSpan(len(ts), rate); len(ts) < perKey || got < want {
			t.Errorf("%d starts of %s took %v from the first to the last, want %d starts over at least %v at %v a second (KeyRateLimit not honoured)",
				len(ts), k, got.Round(time.Millisecond), perKey, want.Round(time.Millisecond), rate)
		}
	}
}

// testAdaptive: with AdaptiveConcurrency and Concurrency(16), a downstream
// answering Overloaded brings the attempts in flight at once down to 2 or
// fewer (adaptiveStreak overloaded starts in a row, measured in the
// handler, after the first settle ones: the adaptive limit starts at 4),
// and every record is handled once it is back.
func testAdaptive(t *testing.T, src flowSource) {
	const n, settle, adaptiveStreak = 200, 4, 5
	cl := newCell(t, src, n, func(i int) int { return i % 100 })
	l := cl.produced(invariant.Unordered)
	down := newFlowGate()
	var (
		inflight atomic.Int64
		mu       sync.Mutex
		failed   int
		streak   int
		trace    []int64 // in flight at each overloaded start
		peak     int64   // most in flight at once among the overloaded attempts after settle
	)
	shrunk := make(chan struct{})
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		now := inflight.Add(1)
		defer inflight.Add(-1)
		if down.up() {
			l.Handled(r)
			return nil
		}
		mu.Lock()
		failed++
		trace = append(trace, now)
		if failed > settle {
			peak = max(peak, now)
			if streak++; now > 2 {
				streak = 0
			}
			if streak == adaptiveStreak {
				close(shrunk)
			}
		}
		mu.Unlock()
		time.Sleep(2 * time.Millisecond) // a 503's round trip: attempts overlap
		return Overloaded(errUnavailable)
	})
	go func() {
		select {
		case <-shrunk:
		case <-time.After(10 * time.Second):
		case <-cl.done.Done():
		}
		down.openNow()
	}()
	sink := &memSink{}
	if !cl.mustRun(h, Concurrency(16), AdaptiveConcurrency(), DeadLetters(sink)) {
		return
	}
	select {
	case <-shrunk:
	default:
		mu.Lock()
		t.Errorf("in flight at once never fell to 2 or fewer for %d overloaded starts in a row within 10s: up to %d at once after the first %d (%d in all); the first starts saw %v",
			adaptiveStreak, peak, settle, failed, trace[:min(len(trace), 24)])
		mu.Unlock()
	}
	if dead := lettersByIndex(sink); len(dead) > 0 {
		t.Errorf("%d of %d records dead-lettered for the downstream's overload, first %s", len(dead), n, cl.describe(firstKeys(dead, 1)[0]))
	}
	if rep := l.Report(); rep.Handled != n {
		t.Errorf("%d of %d records handled: %s", rep.Handled, n, cl.unfinished())
	}
}

// testRetriesThenDeadLetter: records that always fail are tried
// MaxAttempts(3) times, then reach a Kafka dead-letter topic once each,
// with the __dlq.errors.* headers naming the original record, the group,
// the attempts, the class and the error.
func testRetriesThenDeadLetter(t *testing.T, src flowSource) {
	const n = 200
	failing := func(i int) bool { return i%10 == 3 }
	cl := newCell(t, src, n, func(i int) int { return i % 20 })
	dlq := cl.topic + ".dlq"
	createTopic(t, cl.c, dlq, 1)
	sinkClient, err := kgo.NewClient(kgo.SeedBrokers(cl.c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sinkClient.Close)
	attempts := newAttemptLog()
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		i := recordIndex(r)
		attempts.add(i)
		if failing(i) {
			return fmt.Errorf("cannot parse record %d", i)
		}
		return nil
	})
	if !cl.mustRun(h, MaxAttempts(3), DeadLetters(deadletter.NewKafkaSink(sinkClient))) {
		return
	}

	want := 0
	for i := range n {
		handled, dead := cl.fin.counts(cl.recs[i])
		switch {
		case failing(i):
			want++
			if a := attempts.of(i); a != 3 || dead != 1 || handled != 0 {
				t.Errorf("%s: %d attempts, dead-lettered %d times, handled %d; want 3 attempts, then one dead letter", cl.describe(i), a, dead, handled)
			}
		case handled == 0 || dead != 0:
			t.Errorf("%s: handled %d times, dead-lettered %d; want handled, not dead-lettered", cl.describe(i), handled, dead)
		}
	}
	letters := readTopic(t, cl, dlq, want)
	seen := map[int]bool{}
	for _, lr := range letters {
		i := recordIndex(lr)
		orig := cl.recs[i]
		if !failing(i) || seen[i] {
			t.Errorf("dead letter of %s: failing %v, seen before %v", cl.describe(i), failing(i), seen[i])
		}
		seen[i] = true
		wantHeaders := map[string]string{
			deadletter.HeaderTopic:         orig.Topic,
			deadletter.HeaderPartition:     strconv.Itoa(int(orig.Partition)),
			deadletter.HeaderOffset:        strconv.FormatInt(orig.Offset, 10),
			deadletter.HeaderGroup:         cl.group,
			deadletter.HeaderDeliveryCount: "3",
			deadletter.HeaderClass:         string(deadletter.ClassExhausted),
			deadletter.HeaderMessage:       fmt.Sprintf("cannot parse record %d", i),
		}
		for k, v := range wantHeaders {
			if got := dlqHeader(lr, k); got != v {
				t.Errorf("dead letter of %s: header %s = %q, want %q", cl.describe(i), k, got, v)
			}
		}
		if string(lr.Key) != string(orig.Key) {
			t.Errorf("dead letter of %s: key %q, want the original's", cl.describe(i), lr.Key)
		}
	}
}

// dlqHeader is the last value of header k of r ("" if none).
func dlqHeader(r *kgo.Record, k string) string {
	v := ""
	for _, h := range r.Headers {
		if h.Key == k {
			v = string(h.Value)
		}
	}
	return v
}

// readTopic reads want records of topic from its start, failing after
// 10s; it then reads for a moment more, so that a letter written twice
// shows.
func readTopic(t *testing.T, cl *cell, topic string, want int) []*kgo.Record {
	t.Helper()
	c, err := kgo.NewClient(kgo.SeedBrokers(cl.c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want {
		fs := c.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d records of %s in 10s, want %d", len(out), topic, want)
		}
		out = append(out, fs.Records()...)
	}
	more, cancelMore := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelMore()
	out = append(out, c.PollFetches(more).Records()...)
	return out
}

// testPermanent: a Permanent error is dead-lettered after one attempt.
func testPermanent(t *testing.T, src flowSource) {
	const n = 200
	poison := func(i int) bool { return i%10 == 5 }
	cl := newCell(t, src, n, func(i int) int { return i % 20 })
	attempts := newAttemptLog()
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		i := recordIndex(r)
		attempts.add(i)
		if poison(i) {
			return Permanent(errors.New("bad schema"))
		}
		return nil
	})
	sink := &memSink{}
	if !cl.mustRun(h, MaxAttempts(5), DeadLetters(sink)) {
		return
	}
	letters := lettersByIndex(sink)
	for i := range n {
		ls := letters[i]
		switch {
		case !poison(i):
			if len(ls) > 0 {
				t.Errorf("%s dead-lettered, want handled", cl.describe(i))
			}
		case len(ls) != 1 || attempts.of(i) != 1:
			t.Errorf("%s: %d attempts, %d dead letters; want one of each", cl.describe(i), attempts.of(i), len(ls))
		case ls[0].Attempts != 1 || ls[0].Class != deadletter.ClassPermanent:
			t.Errorf("dead letter of %s: attempts %d, class %s; want 1, permanent", cl.describe(i), ls[0].Attempts, ls[0].Class)
		}
	}
	if m := cl.fin.missing(cl.recs); len(m) > 0 {
		t.Errorf("%s", cl.unfinished())
	}
}

// testStuck: a record whose handler blocks is reported through
// HookRecordStuck, with its topic, partition and offset, after StuckAfter.
func testStuck(t *testing.T, src flowSource) {
	const n, blocked = 20, 7
	cl := newCell(t, src, n, func(i int) int { return i })
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if recordIndex(r) == blocked {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	go func() {
		select {
		case <-cl.fin.stuckCh:
		case <-time.After(5 * time.Second):
		case <-cl.done.Done():
		}
		close(release)
	}()
	if !cl.mustRun(h, StuckAfter(100*time.Millisecond), AttemptTimeout(20*time.Second)) {
		return
	}
	b := cl.recs[blocked]
	want := stuckReport{b.Topic, b.Partition, b.Offset}
	if got := cl.fin.stuckReports(); len(got) != 1 || got[0] != want {
		t.Errorf("stuck reports %+v within 5s of the start, want one for %s", got, cl.describe(blocked))
	}
}

// The shutdown rows: cancelling the run (Run's context, Backfill's ctx)
// while handlers block makes it return within ShutdownTimeout and a
// second, with ErrShutdownTimeout in its error: every source promises it
// (records were left unfinished). The second is less than
// ShutdownTimeout, so that a source taking twice ShutdownTimeout fails.
const (
	shutdownTimeout = 2 * time.Second
	shutdownBound   = shutdownTimeout + time.Second
)

// testShutdownBound: the handlers block until their context is cancelled.
func testShutdownBound(t *testing.T, src flowSource) {
	shutdownRow(t, src, func(ctx context.Context) { <-ctx.Done() })
}

// testShutdownBoundCtxIgnored: the handlers ignore their context; they
// block until the test ends.
func testShutdownBoundCtxIgnored(t *testing.T, src flowSource) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // lets the stray handlers go before goleak looks
	shutdownRow(t, src, func(context.Context) { <-release })
}

func shutdownRow(t *testing.T, src flowSource, block func(ctx context.Context)) {
	const n = 20
	cl := newCell(t, src, n, func(i int) int { return i })
	started := make(chan struct{})
	var once sync.Once
	h := HandlerFunc(func(ctx context.Context, _ *kgo.Record) error {
		once.Do(func() { close(started) })
		block(ctx)
		return ctx.Err()
	})
	r := cl.start(h, ShutdownTimeout(shutdownTimeout))
	select {
	case <-started:
	case <-r.done:
		t.Fatalf("returned before a handler started: %v", r.err)
	case <-time.After(flowBound):
		t.Fatalf("no handler started within %v", flowBound)
	}
	begin := time.Now()
	err := r.stop()
	took := time.Since(begin)
	if took > shutdownBound {
		t.Errorf("returned %v after the cancel, with ShutdownTimeout %v: want at most %v", took.Round(time.Millisecond), shutdownTimeout, shutdownBound)
	}
	if !errors.Is(err, ErrShutdownTimeout) {
		t.Errorf("returned %v, want ErrShutdownTimeout joined: records were left unfinished", err)
	}
}

// testPoisonStorm: a third of the records fail permanently, a third fail
// twice and then succeed, the rest succeed: each ends as expected, none is
// lost and none is dead-lettered twice.
func testPoisonStorm(t *testing.T, src flowSource) {
	const n = 300
	cl := newCell(t, src, n, func(i int) int { return i % 30 })
	attempts := newAttemptLog()
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		i := recordIndex(r)
		a := attempts.add(i)
		switch {
		case i%3 == 0:
			return Permanent(fmt.Errorf("poison %d", i))
		case i%3 == 1 && a <= 2:
			return fmt.Errorf("flaky %d, attempt %d", i, a)
		}
		return nil
	})
	sink := &memSink{}
	if !cl.mustRun(h, MaxAttempts(3), DeadLetters(sink)) {
		return
	}
	letters := lettersByIndex(sink)
	bad := 0
	for i := range n {
		handled, dead := cl.fin.counts(cl.recs[i])
		var ok bool
		switch i % 3 {
		case 0:
			ok = handled == 0 && dead == 1 && len(letters[i]) == 1 && attempts.of(i) == 1
		case 1:
			ok = handled == 1 && dead == 0 && len(letters[i]) == 0 && attempts.of(i) == 3
		default:
			ok = handled == 1 && dead == 0 && len(letters[i]) == 0 && attempts.of(i) == 1
		}
		if !ok {
			if bad++; bad <= 5 {
				t.Errorf("%s (kind %d): handled %d, dead-lettered %d (%d letters in the sink), %d attempts",
					cl.describe(i), i%3, handled, dead, len(letters[i]), attempts.of(i))
			}
		}
	}
	if bad > 5 {
		t.Errorf("%d records in all ended otherwise than expected", bad)
	}
}

// testOrder: with a handler that takes a little time, a few hot keys and
// some records failing once, the source keeps the order it promises: the
// ledger finds no violation (per key, per partition), or no two records
// of a key run at once (a share group in ByKey mode). Every source must
// lose nothing.
func testOrder(t *testing.T, src flowSource) {
	const n = 400
	// Half the records on 4 hot keys, the rest spread over 40.
	cl := newCell(t, src, n, func(i int) int {
		if i%2 == 0 {
			return i / 2 % 4
		}
		return 4 + i%40
	})
	check := map[promise]invariant.Order{promisesKeyOrder: invariant.ByKey, promisesPartitionOrder: invariant.ByPartition}[src.promise]
	l := cl.produced(check)
	attempts := newAttemptLog()
	var (
		mu      sync.Mutex
		running = map[string]int{}
		overlap []string
	)
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		k := string(r.Key)
		mu.Lock()
		if running[k]++; running[k] > 1 && len(overlap) < 5 {
			overlap = append(overlap, fmt.Sprintf("%s with %d other(s) of %s", cl.describe(recordIndex(r)), running[k]-1, k))
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[k]--
			mu.Unlock()
		}()
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		if i := recordIndex(r); i%17 == 0 && attempts.add(i) == 1 {
			return errors.New("fails once")
		}
		l.Handled(r)
		return nil
	})
	if !cl.mustRun(h) {
		return
	}
	rep := l.Report()
	if err := rep.Check(-1); err != nil {
		t.Errorf("%s promises %v: %v", src.name, src.promise, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if src.promise == promisesKeyExclusive && len(overlap) > 0 {
		t.Errorf("records of one key ran at once: %v", overlap)
	}
	t.Logf("%d handled, %d duplicates; %d starts overlapped another of their key", rep.Handled, rep.Duplicates, len(overlap))
}

// testOutputs: a handler's outputs (Emit, with Outputs) are produced at
// least once: every record has its output in the output topic once it is
// finished. (Exactly once is a consumer group's alone, ExactlyOnce, which a
// share group refuses and Backfill cannot take: outputs_test.go proves it.)
func testOutputs(t *testing.T, src flowSource) {
	const n = 200
	cl := newCell(t, src, n, func(i int) int { return i % 20 })
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		return Emit(ctx, outputOf("outputs", r))
	})
	if !cl.mustRun(h, Outputs(), ClientOptions(kgo.AllowAutoTopicCreation())) {
		return
	}
	outs := readOutputs(t, cl.c, "outputs", n, 20*time.Second)
	seen := map[[2]int64]bool{}
	for _, o := range outs {
		p, off, _ := inputOf(o)
		seen[[2]int64{int64(p), off}] = true
	}
	for i, r := range cl.recs {
		if !seen[[2]int64{int64(r.Partition), r.Offset}] {
			t.Errorf("%s has no output", cl.describe(i))
		}
	}
}

// testMaxBufferedBytes: MaxBufferedBytes bounds the key, value and header
// bytes of the records held, those in flight included, to the bound plus
// one record (its doc in options.go). With values of 64 KiB, a bound of
// two and a half records and handlers that hold each record until the
// pipeline settled (heldBytes), the bytes of the records handed to
// handlers and not finished never pass the bound plus the largest record,
// and every record is handled, in the order the source promises. The
// handlers see only the records in flight, not those held in windows: in
// ByPartition mode one record of each partition at most.
func testMaxBufferedBytes(t *testing.T, src flowSource) {
	const (
		n         = 64
		valueSize = 64 << 10
		bound     = 5 * valueSize / 2
	)
	cl := newSizedCell(t, src, n, func(i int) int { return i }, valueSize)
	check := map[promise]invariant.Order{promisesKeyOrder: invariant.ByKey, promisesPartitionOrder: invariant.ByPartition}[src.promise]
	l := cl.produced(check)
	// Two records: what every source holds in flight once the bound is
	// used up, since one partition takes at most two records of it (more
	// than its share only while less than half the bound is used): two
	// partitions have records in flight, even in ByPartition mode.
	hb := newHeldBytes(2)
	defer hb.releaseSettled(cl.done)()
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		hb.hold(ctx, r)
		l.Handled(r)
		return nil
	})
	// Fetches of several times the bound, as a user's ClientOptions may
	// ask for: a poll brings records of every partition at once, and the
	// bound holds whatever a poll brings.
	big := ClientOptions(kgo.FetchMaxBytes(8<<20), kgo.FetchMaxPartitionBytes(1<<20))
	if !cl.mustRun(h, MaxBufferedBytes(bound), Concurrency(16), big) {
		return
	}
	var largest int64
	for _, r := range cl.recs {
		largest = max(largest, boundedBytes(r))
	}
	peak, peakRecords := hb.peak.Load(), hb.peakRecords.Load()
	if peak > bound+largest {
		t.Errorf("%d records (%d bytes) handed to handlers and not finished at once with MaxBufferedBytes %d: want at most %d bytes (the bound plus one record)",
			peakRecords, peak, bound, bound+largest)
	}
	if peakRecords < hb.fill {
		t.Errorf("at most %d record(s) in flight at once, in the %v after the first: want %d, as a pipeline that admits records of several partitions within the bound has",
			peakRecords, fillWait, hb.fill)
	}
	rep := l.Report()
	if rep.Handled != n {
		t.Errorf("%d of %d records handled: %s", rep.Handled, n, cl.unfinished())
	}
	if err := rep.Check(-1); err != nil {
		t.Errorf("%s promises %v: %v", src.name, src.promise, err)
	}
	t.Logf("at most %d records (%d bytes) in flight at once, MaxBufferedBytes %d (%d with one record more)", peakRecords, peak, bound, bound+largest)
}

// boundedBytes is what MaxBufferedBytes promises to bound of a record:
// its key, value and header bytes (what the budget counts, less its
// estimate of the memory around them).
func boundedBytes(r *kgo.Record) int64 { return recordSize(r) - recordOverhead }

// heldBytes is a handler's side of a full pipeline: it holds every record
// handed to it until releaseSettled lets it go, and keeps the most bytes
// and records held at once. A record's bytes leave before its handler
// returns, so what it counts is never more than the pipeline holds.
type heldBytes struct {
	fill    int64 // records held before the first is let go
	release chan struct{}

	starts            atomic.Int64 // records handed to the handler so far
	bytes, records    atomic.Int64 // held now
	peak, peakRecords atomic.Int64 // the most held at once
}

func newHeldBytes(fill int64) *heldBytes {
	return &heldBytes{fill: fill, release: make(chan struct{})}
}

// hold holds r until releaseSettled lets one record go (or ctx ends).
func (hb *heldBytes) hold(ctx context.Context, r *kgo.Record) {
	size := boundedBytes(r)
	raise(&hb.peak, hb.bytes.Add(size))
	raise(&hb.peakRecords, hb.records.Add(1))
	hb.starts.Add(1)
	select {
	case <-hb.release:
	case <-ctx.Done():
	}
	hb.records.Add(-1)
	hb.bytes.Add(-size)
}

// raise makes a at least v.
func raise(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// settleTick is how long no record may be handed to the handler for the
// pipeline to count as settled: it then admits nothing more until a record
// finishes. A loaded machine only makes a release come early, and the
// pipeline fuller less often; it never makes the row fail.
const settleTick = 10 * time.Millisecond

// fillWait bounds the wait, from the first record handed over, for fill
// records held: a source that never gets there (one admitting a whole
// poll of one partition in ByPartition mode) is released after it, and
// the row fails.
const fillWait = 5 * time.Second

// releaseSettled lets one held record go each time the pipeline settled
// (no record handed over for a settleTick), the first only once fill
// records are held (or fillWait passed): the pipeline stays as full as it
// gets, and admits again record by record. It runs until stop is called
// or done ends.
func (hb *heldBytes) releaseSettled(done context.Context) (stop func()) {
	quit := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(settleTick)
		defer tick.Stop()
		last, filled := int64(-1), false
		var first time.Time // when a record was first seen handed over
		for {
			select {
			case <-tick.C:
			case <-quit:
				return
			case <-done.Done():
				return
			}
			starts, held := hb.starts.Load(), hb.records.Load()
			settled := starts == last
			last = starts
			if first.IsZero() && starts > 0 {
				first = time.Now()
			}
			filled = filled || held >= hb.fill || (starts > 0 && time.Since(first) > fillWait)
			if !settled || !filled || held == 0 {
				continue
			}
			select {
			case hb.release <- struct{}{}:
			case <-quit:
				return
			case <-done.Done():
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-exited
	}
}
