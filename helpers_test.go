package kpar

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kpar/kpar/deadletter"
	invariant "github.com/kpar/kpar/internal/ledger"
	"github.com/kpar/kpar/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testLogger discards the logs unless KPAR_TEST_LOG is set: to "debug",
// it logs kpar's debug level and franz-go's info level (every join, fetch
// session and commit), to anything else kpar's info level and franz-go's
// warnings.
func testLogger() *slog.Logger {
	level := slog.LevelInfo
	switch os.Getenv("KPAR_TEST_LOG") {
	case "":
		return slog.New(slog.DiscardHandler)
	case "debug":
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// testOpts are the options every test consumer shares: fast heartbeats
// and commits, short timeouts. An empty group leaves out CommitInterval,
// for shareOpts.
//
// On a real cluster the session timeout is 6s, the least Kafka allows by
// default (group.min.session.timeout.ms), and group and topic get the
// test's prefix.
func testOpts(c cluster, group, topic string) []ConsumerOpt {
	logger := testLogger()
	heartbeat, session := 100*time.Millisecond, 2*time.Second
	if onRealCluster(c) {
		heartbeat, session = 500*time.Millisecond, testkit.RealSessionTimeout
	}
	opts := []ConsumerOpt{
		WithLogger(logger),
		Brokers(c.ListenAddrs()...),
		Group(nameIn(c, group)),
		Topics(nameIn(c, topic)),
		RetryBackoff(time.Millisecond, 10*time.Millisecond),
		ShutdownTimeout(10 * time.Second),
		ClientOptions(
			kgo.HeartbeatInterval(heartbeat),
			kgo.SessionTimeout(session),
			kgo.RebalanceTimeout(5*time.Second),
			kgo.FetchMaxWait(100*time.Millisecond),
		),
	}
	if group != "" { // not for shareOpts: a share group takes no CommitInterval
		opts = append(opts, CommitInterval(50*time.Millisecond))
	}
	return opts
}

// produced describes one test record: its key index and its sequence number
// within the key, encoded in the value.
type produced struct {
	key int
	seq int
}

func encodeValue(key, seq int) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, uint64(key))
	binary.BigEndian.PutUint64(b[8:], uint64(seq))
	return b
}

func decodeValue(b []byte) produced {
	return produced{key: int(binary.BigEndian.Uint64(b)), seq: int(binary.BigEndian.Uint64(b[8:]))}
}

// produce writes n records spread over keys keys (key i%keys), each value
// carrying (key, per-key sequence). Records of one key land in one
// partition, in production order.
func produce(t testing.TB, c cluster, topic string, n, keys int, onAck ...func(*kgo.Record)) {
	t.Helper()
	produceRange(t, c, nameIn(c, topic), 0, n, keys, onAck...)
}

// awaitCommittedAtEnd waits (up to 30s) until the group's commit reached
// the topic's end on every partition; what names the moment in the error.
func awaitCommittedAtEnd(t testing.TB, c cluster, group, topic, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		committed, end := offsets(t, c, group, topic)
		done := true
		for p, o := range end {
			done = done && committed[p] == o
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: committed %v of %v", what, committed, end)
		}
		time.Sleep(20 * time.Millisecond) // polling the broker's offsets
	}
}

// offsets returns the group's committed offsets and the topic's high
// watermarks.
func offsets(t testing.TB, c cluster, group, topic string) (committed, end map[int32]int64) {
	t.Helper()
	group, topic = nameIn(c, group), nameIn(c, topic)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	os, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	committed = map[int32]int64{}
	os.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic {
			committed[o.Partition] = o.At
		}
	})
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	end = map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	return committed, end
}

// runConsumer runs c in the background and returns a stop function that
// cancels it and returns Run's error.
func runConsumer(t testing.TB, c *Consumer) (stop func() error) {
	t.Helper()
	return testkit.Start(t, "Run", c.Run)
}

// waitFor waits for ch to be closed or fails the test after d.
func waitFor(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// ledgerOrder is the order internal/ledger checks for an ordering mode.
func ledgerOrder(o Order) invariant.Order {
	switch o {
	case ByKey:
		return invariant.ByKey
	case ByPartition:
		return invariant.ByPartition
	}
	return invariant.Unordered
}

// adminClient returns an admin client of c, closed when the test ends.
func adminClient(t testing.TB, c cluster) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// createTopic creates a topic on c.
func createTopic(t testing.TB, c cluster, topic string, partitions int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Replication factor -1: the broker's default (1 on kfake).
	resp, err := adminClient(t, c).CreateTopic(ctx, partitions, -1, nil, nameIn(c, topic))
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatal(err)
	}
}

// countingHandler is a slog.Handler that counts records.
type countingHandler struct{ n *atomic.Int64 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h countingHandler) Handle(context.Context, slog.Record) error { h.n.Add(1); return nil }
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h countingHandler) WithGroup(string) slog.Handler             { return h }

// commitWatch is the hook that feeds a run's commits and dead letters to
// its ledger, and lets a test wait until the commits reached given
// offsets.
type commitWatch struct {
	l *invariant.Ledger

	mu        sync.Mutex // guards the fields below
	committed map[string]map[int32]int64
	changed   chan struct{} // closed and replaced on each commit
}

func newCommitWatch(l *invariant.Ledger) *commitWatch {
	return &commitWatch{l: l, committed: map[string]map[int32]int64{}, changed: make(chan struct{})}
}

// OnCommit: what the hook is given succeeded (a failed partition is left
// out), so each offset is checked against the unfinished records.
func (w *commitWatch) OnCommit(offs map[string]map[int32]int64, _ error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for topic, ps := range offs {
		if w.committed[topic] == nil {
			w.committed[topic] = map[int32]int64{}
		}
		for p, o := range ps {
			w.l.Committed(topic, p, o)
			w.committed[topic][p] = max(w.committed[topic][p], o)
		}
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *commitWatch) OnDeadLettered(l deadletter.Letter) { w.l.DeadLettered(l.Record) }

// waitAll waits until every partition in want has a commit at or past its
// offset.
func (w *commitWatch) waitAll(t testing.TB, want map[string]map[int32]int64, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		w.mu.Lock()
		var behind []string
		for topic, ps := range want {
			for p, o := range ps {
				if got := w.committed[topic][p]; got < o {
					behind = append(behind, fmt.Sprintf("%s/%d at %d of %d", topic, p, got, o))
				}
			}
		}
		ch := w.changed
		w.mu.Unlock()
		if len(behind) == 0 {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("commits behind after %v: %v", d, behind)
		}
	}
}

// total is the sum of the offsets committed for topic's partitions: the
// records below the commit points, as partitions start at 0.
func (w *commitWatch) total(topic string) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var n int64
	for _, o := range w.committed[topic] {
		n += o
	}
	return n
}

// waitTotal waits until total(topic) is at least want.
func (w *commitWatch) waitTotal(t testing.TB, topic string, want int64, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		w.mu.Lock()
		ch := w.changed
		w.mu.Unlock()
		if w.total(topic) >= want {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("commits of %s total %d after %v, want %d", topic, w.total(topic), d, want)
		}
	}
}

// ends collects the end offsets of what a test produced, from the
// acknowledgements.
type ends struct {
	mu   sync.Mutex
	next map[string]map[int32]int64
}

func newEnds() *ends { return &ends{next: map[string]map[int32]int64{}} }

func (e *ends) ack(r *kgo.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.next[r.Topic] == nil {
		e.next[r.Topic] = map[int32]int64{}
	}
	e.next[r.Topic][r.Partition] = max(e.next[r.Topic][r.Partition], r.Offset+1)
}

func (e *ends) snapshot() map[string]map[int32]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]map[int32]int64{}
	for topic, ps := range e.next {
		out[topic] = maps.Clone(ps)
	}
	return out
}

// testEngineOf is testEngine with c and h.
func testEngineOf(t *testing.T, c *cfg, h Handler) *engine {
	t.Helper()
	e, err := newEngine(c, h, nil, &hooks{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// testEngine is a whole pipeline, built as Run builds it, for the unit
// tests of its rooms: defaultCfg changed by set, no source, nothing
// started.
func testEngine(set func(*cfg)) *engine { return testEngineWithSource(set, nil) }

// testEngineWithSource is testEngine with the source newSource makes.
func testEngineWithSource(set func(*cfg), newSource func(*engine) source) *engine {
	c := defaultCfg()
	if set != nil {
		set(&c)
	}
	e, err := newEngine(&c, HandlerFunc(func(context.Context, *kgo.Record) error { return nil }), nil, &hooks{}, newSource)
	if err != nil {
		panic(err)
	}
	return e
}
