package kpar

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/kpar/kpar/internal/testkit"
)

// The conformance suite's harness (conformance_test.go has the table):
// the sources a row runs on, and the cell, one row on one source over a
// topic of its own on a kfake cluster of its own.

// FlowOpt is an option that every source takes: New, for consumer and
// share groups, and Backfill alike. The rows pass their options as
// flowOpts only, so that when the option kinds change, this line is the
// one to change.

// promise is the ordering a source promises.
type promise int

const (
	promisesNoOrder promise = iota
	// promisesKeyOrder: records of one partition and key are handled in
	// offset order (the ledger's ByKey check).
	promisesKeyOrder
	// promisesPartitionOrder: records of one partition are handled in
	// offset order (the ledger's ByPartition check).
	promisesPartitionOrder
	// promisesKeyExclusive: never two records of one key at once within
	// this member (a share group in ByKey mode), but in no set order.
	promisesKeyExclusive
)

func (p promise) String() string {
	return [...]string{"no order", "per-key order", "per-partition order", "one record of a key at a time"}[p]
}

// flowSource is one way kpar consumes, as the suite runs it.
type flowSource struct {
	name    string
	promise promise
	// endsByItself: run returns once every record is finished (Backfill);
	// otherwise the harness cancels it then (a group member runs until
	// stopped).
	endsByItself bool
	// run hands the cell's records to h until ctx ends (or, with
	// endsByItself, until they are done), with the source's own options,
	// then the harness's and the row's opts.
	run func(ctx context.Context, cl *cell, h Handler, opts []FlowOpt) error
}

// flowSources are the columns of the suite: every way to consume, in every
// ordering mode it has.
func flowSources() []flowSource {
	return []flowSource{
		groupFlowSource("group-key", ByKey, promisesKeyOrder),
		groupFlowSource("group-partition", ByPartition, promisesPartitionOrder),
		groupFlowSource("group-unordered", Unordered, promisesNoOrder),
		shareFlowSource("share-key", ByKey, promisesKeyExclusive),
		shareFlowSource("share-unordered", Unordered, promisesNoOrder),
		{name: "backfill", promise: promisesNoOrder, endsByItself: true, run: runBackfillSource},
	}
}

// The sources' own options come first and the flowOpts after them, one by
// one: each append compiles as long as a FlowOpt is an option of the kind
// that New (or Backfill) takes.

func groupFlowSource(name string, o Order, p promise) flowSource {
	return memberSource(name, o, p, func(cl *cell) []ConsumerOpt { return testOpts(cl.c, cl.group, cl.topic) })
}

func shareFlowSource(name string, o Order, p promise) flowSource {
	return memberSource(name, o, p, func(cl *cell) []ConsumerOpt { return shareOpts(cl.c, cl.group, cl.topic) })
}

// memberSource runs a Consumer of New with the options of base (which
// name the group or share group) in ordering mode o.
func memberSource(name string, o Order, p promise, base func(*cell) []ConsumerOpt) flowSource {
	return flowSource{name: name, promise: p, run: func(ctx context.Context, cl *cell, h Handler, opts []FlowOpt) error {
		all := append(base(cl), Ordering(o))
		for _, opt := range opts {
			all = append(all, opt)
		}
		cons, err := New(h, all...)
		if err != nil {
			return err
		}
		return cons.Run(ctx)
	}}
}

// runBackfillSource reads the whole topic: every partition from offset 0
// to its end (the first offset at or after a time to come is the high
// watermark), with the cell's group named in dead letters.
func runBackfillSource(ctx context.Context, cl *cell, h Handler, opts []FlowOpt) error {
	all := append(backfillOpts(cl.c), Group(cl.group))
	for _, opt := range opts {
		all = append(all, opt)
	}
	r := Range{Topic: cl.topic, From: AtOffset(0), To: AtTime(time.Now().Add(24 * time.Hour))}
	_, err := Backfill(ctx, h, r, all...)
	return err
}

const (
	flowPartitions = 4
	// flowBound bounds each run of a cell: past it the run is stopped and
	// the cell fails, naming the records that did not finish.
	flowBound = 20 * time.Second
)

// cell is one row on one source: a kfake cluster holding one topic of
// flowPartitions partitions filled with n records, record i keyed
// "key-<keyOf(i)>" and valued i (8 bytes, big-endian, then zeros up to
// the cell's value size).
type cell struct {
	t    *testing.T
	name string // "row/source"
	src  flowSource
	// done ends when the test does: the cell's helper goroutines wait on
	// it besides what they wait for, so none outlives its test.
	done  context.Context
	c     *kfake.Cluster
	topic string
	group string // the consumer group, the share group or Backfill's Group
	n     int
	recs  []*kgo.Record // index -> the record as produced (partition and offset set)
	fin   *finishes
}

func newCell(t *testing.T, src flowSource, n int, keyOf func(i int) int) *cell {
	t.Helper()
	return newSizedCell(t, src, n, keyOf, 8)
}

// newSizedCell is newCell with values of valueSize bytes (8 at least).
func newSizedCell(t *testing.T, src flowSource, n int, keyOf func(i int) int, valueSize int) *cell {
	t.Helper()
	const topic = "conformance"
	c := testkit.Cluster(t,
		kfake.SeedTopics(flowPartitions, topic),
		kfake.AllowAutoTopicCreation(),
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
		kfake.BrokerConfigs(map[string]string{
			// Share records stay acquired for the whole cell: a
			// redelivery would be a test artefact, not a rule.
			"group.share.record.lock.duration.ms": "60000",
			"share.record.lock.sweep.interval.ms": "1000",
		}),
	)
	group := map[bool]string{true: "sg", false: "cg"}[strings.HasPrefix(src.name, "share")]
	if src.endsByItself {
		group = "bf"
	}
	rs := make([]*kgo.Record, n)
	for i := range rs {
		v := make([]byte, max(8, valueSize))
		binary.BigEndian.PutUint64(v, uint64(i))
		rs[i] = &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "key-%d", keyOf(i)), Value: v}
	}
	testkit.Produce(t, c.ListenAddrs(), rs...)
	name := strings.SplitN(t.Name(), "/", 2)[1]
	return &cell{t: t, name: name, src: src, done: t.Context(), c: c, topic: topic, group: group, n: n, recs: rs, fin: newFinishes(n)}
}

// recordIndex is the number of a record of the cell (or of its dead letter).
func recordIndex(r *kgo.Record) int { return int(binary.BigEndian.Uint64(r.Value)) }

// describe names record i for a failure message.
func (cl *cell) describe(i int) string {
	r := cl.recs[i]
	return fmt.Sprintf("record %d (%s/%d@%d, key %s)", i, r.Topic, r.Partition, r.Offset, r.Key)
}

// produced returns a ledger that has seen every record of the cell.
func (cl *cell) produced(o invariant.Order) *invariant.Ledger {
	l := invariant.New(o, int64(cl.n))
	for _, r := range cl.recs {
		l.Produced(r)
	}
	return l
}

// flowRun is one run of a source in the background.
type flowRun struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
	stopMu sync.Once
}

// start runs the source over the cell with h; the harness's options (its
// hooks, fast retries) come before opts.
func (cl *cell) start(h Handler, opts ...FlowOpt) *flowRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &flowRun{t: cl.t, cancel: cancel, done: make(chan struct{})}
	all := append([]FlowOpt{WithHooks(cl.fin), RetryBackoff(time.Millisecond, 5*time.Millisecond)}, opts...)
	go func() {
		defer close(r.done)
		r.err = cl.src.run(ctx, cl, h, all)
	}()
	cl.t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels the run and returns its error, failing the test if it does
// not return within 30s.
func (r *flowRun) stop() error {
	r.stopMu.Do(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			r.t.Errorf("the source did not return within 30s of its context's cancel")
		}
	})
	select {
	case <-r.done:
		return r.err
	default:
		return nil
	}
}

// run runs the source over the cell until every record is finished
// (handled or dead-lettered, as the hooks tell) or, for a source that ends
// by itself, until it returns; past flowBound it stops the run and fails
// the test naming the records that did not finish. It returns the
// source's error.
func (cl *cell) run(h Handler, opts ...FlowOpt) error {
	cl.t.Helper()
	r := cl.start(h, opts...)
	bound := time.NewTimer(flowBound)
	defer bound.Stop()
	all := cl.fin.all
	if cl.src.endsByItself {
		all = nil // its own return says it is done
	}
	select {
	case <-r.done:
		return r.err
	case <-all:
		return r.stop()
	case <-bound.C:
	}
	err := r.stop()
	cl.t.Errorf("the run was stopped after %v: %s", flowBound, cl.unfinished())
	return err
}

// mustRun is run failing the test on an error. It reports false when the
// source refused the options at start (an error before any attempt) and
// acceptedRefusals lists the cell: the row then passes as refused, and
// checks nothing more.
func (cl *cell) mustRun(h Handler, opts ...FlowOpt) (ran bool) {
	cl.t.Helper()
	err := cl.run(h, opts...)
	switch {
	case err == nil:
		return true
	case acceptedRefusals[cl.name] && cl.fin.dispatched.Load() == 0:
		cl.t.Logf("refused, as acceptedRefusals allows: %v", err)
		return false
	}
	cl.t.Fatalf("%s: %v", cl.src.name, err)
	return false
}

// unfinished describes the records not finished yet.
func (cl *cell) unfinished() string {
	missing := cl.fin.missing(cl.recs)
	if len(missing) == 0 {
		return "every record finished"
	}
	return fmt.Sprintf("%d of %d records never finished (handled or dead-lettered), first %s", len(missing), cl.n, cl.describe(missing[0]))
}

// finishes is the harness's hook: it counts each record's successes and
// dead letters, and collects stuck reports.
type finishes struct {
	want       int
	all        chan struct{} // closed once want distinct records finished
	dispatched atomic.Int64  // attempts started

	mu      sync.Mutex // guards the fields below
	handled map[string]int
	dead    map[string]int
	stuck   []stuckReport
	stuckCh chan struct{} // closed at the first stuck report
}

type stuckReport struct {
	topic     string
	partition int32
	offset    int64
}

func newFinishes(want int) *finishes {
	return &finishes{want: want, all: make(chan struct{}), handled: map[string]int{}, dead: map[string]int{}, stuckCh: make(chan struct{})}
}

func recordID(topic string, p int32, o int64) string { return fmt.Sprintf("%s/%d@%d", topic, p, o) }

func (f *finishes) OnRecordDispatched(*kgo.Record, int) { f.dispatched.Add(1) }

func (f *finishes) OnRecordDone(r *kgo.Record, _ int, _ time.Duration) {
	f.note(f.handled, recordID(r.Topic, r.Partition, r.Offset))
}

func (f *finishes) OnDeadLettered(l deadletter.Letter) {
	f.note(f.dead, recordID(l.Record.Topic, l.Record.Partition, l.Record.Offset))
}

func (f *finishes) note(m map[string]int, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	before := f.finishedLocked()
	m[id]++
	if n := f.finishedLocked(); n == f.want && n > before {
		close(f.all)
	}
}

// finishedLocked counts the distinct records finished. Called with mu
// held.
func (f *finishes) finishedLocked() int {
	n := len(f.handled)
	for id := range f.dead {
		if f.handled[id] == 0 {
			n++
		}
	}
	return n
}

func (f *finishes) OnRecordStuck(topic string, partition int32, offset int64, _ int, _ time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stuck = append(f.stuck, stuckReport{topic, partition, offset})
	if len(f.stuck) == 1 {
		close(f.stuckCh)
	}
}

// counts returns, for record r, its successes and its dead letters.
func (f *finishes) counts(r *kgo.Record) (handled, dead int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := recordID(r.Topic, r.Partition, r.Offset)
	return f.handled[id], f.dead[id]
}

// deadLettered counts the records dead-lettered.
func (f *finishes) deadLettered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.dead)
}

// missing returns the indexes of recs not finished.
func (f *finishes) missing(recs []*kgo.Record) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for i, r := range recs {
		id := recordID(r.Topic, r.Partition, r.Offset)
		if f.handled[id] == 0 && f.dead[id] == 0 {
			out = append(out, i)
		}
	}
	return out
}

// stuckReports returns the stuck reports so far.
func (f *finishes) stuckReports() []stuckReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.stuck)
}

// attemptLog counts a handler's attempts per record index.
type attemptLog struct {
	mu sync.Mutex
	n  map[int]int
}

func newAttemptLog() *attemptLog { return &attemptLog{n: map[int]int{}} }

// add counts an attempt of record i and returns its number, from 1.
func (a *attemptLog) add(i int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n[i]++
	return a.n[i]
}

func (a *attemptLog) of(i int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[i]
}

// lettersByIndex groups a memSink's letters by record index.
func lettersByIndex(s *memSink) map[int][]deadletter.Letter {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int][]deadletter.Letter{}
	for _, l := range s.letters {
		out[recordIndex(l.Record)] = append(out[recordIndex(l.Record)], l)
	}
	return out
}

// firstKeys returns the smallest few keys of m, sorted, for messages.
func firstKeys[V any](m map[int]V, few int) []int {
	ks := slices.Sorted(maps.Keys(m))
	return ks[:min(few, len(ks))]
}
