package kpar

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// TestFaultMatrixOversizedOutput is the fault matrix's "oversized output"
// column (issue 35): one record's output is larger than its topic's
// max.message.bytes, on each way of consuming that takes outputs (Outputs
// is an option of every source; ExactlyOnce one of groups only, a share
// group refuses it at New: that cell is "refused", TestOptionConflicts).
// Each cell is judged as the other rows are: nothing lost, only that
// record dead-lettered (saying why), every other record's output produced
// (exactly once under ExactlyOnce, read_committed), no output of the
// record that did not fit, no run past flowBound, and for groups the
// commit reaching every partition's end. Readiness (/readyz) is kpar
// forward's and is judged in cmd/kpar's TestFaultMatrix.
func TestFaultMatrixOversizedOutput(t *testing.T) {
	eosSource := func(name string, p Protocol) flowSource {
		return memberSource(name, ByKey, promisesKeyOrder, func(cl *cell) []ConsumerOpt {
			return append(testOpts(cl.c, cl.group, cl.topic), GroupProtocol(p), ExactlyOnce(), InstanceID("m1"))
		})
	}
	cols := []struct {
		src       flowSource
		eos       bool
		stopEarly bool // stop once the handler saw every record (stopEarlyEnv)
	}{
		{groupFlowSource("group-classic", ByKey, promisesKeyOrder), false, false},
		{memberSource("group-consumer", ByKey, promisesKeyOrder, func(cl *cell) []ConsumerOpt {
			return append(testOpts(cl.c, cl.group, cl.topic), GroupProtocol(ConsumerProtocol))
		}), false, false},
		{shareFlowSource("share", ByKey, promisesKeyExclusive), false, false},
		{flowSource{name: "backfill", promise: promisesNoOrder, endsByItself: true, run: runBackfillSource}, false, false},
		{eosSource("group-classic", ClassicProtocol), true, false},
		{eosSource("group-consumer", ConsumerProtocol), true, false},
		// The final transaction at the stop holds the output that does not
		// fit: it ends as a running one does (Run returned ErrFinalCommit,
		// MESSAGE_TOO_LARGE, before the commit retried a refit at once).
		{eosSource("group-classic", ClassicProtocol), true, true},
		{eosSource("group-consumer", ConsumerProtocol), true, true},
	}
	for _, col := range cols {
		mode := "at-least-once"
		if col.eos {
			mode = "exactly-once"
		}
		name := mode + "/" + col.src.name
		if col.stopEarly {
			name += "/stopped-early"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			oversizedCell(t, col.src, col.eos, col.stopEarly || os.Getenv(stopEarlyEnv) != "")
		})
	}
}

func oversizedCell(t *testing.T, src flowSource, eos, stopEarly bool) {
	const n, big, limit = 40, 17, 16 << 10
	cl := newCell(t, src, n, func(i int) int { return i % 5 })
	client, err := kgo.NewClient(kgo.SeedBrokers(cl.c.ListenAddrs()...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	max := fmt.Sprint(limit)
	if _, err := kadm.NewClient(client).CreateTopic(t.Context(), flowPartitions, 1, map[string]*string{"max.message.bytes": &max}, "out"); err != nil {
		t.Fatal(err)
	}
	// The dead-letter topic exists before the run, as an operator creates
	// it. Left to auto-creation (KPAR_FAULTMATRIX_DLQ_AUTOCREATE=1), the
	// exactly-once cells stall: no commit lands in 20s (kfake; see the
	// report in BENCHMARKS.md).
	if os.Getenv(dlqAutoCreateEnv) == "" {
		if _, err := kadm.NewClient(client).CreateTopic(t.Context(), 1, 1, nil, cl.topic+".dlq"); err != nil {
			t.Fatal(err)
		}
	}
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		out := outputOf("out", r)
		if recordIndex(r) == big {
			out.Value = append(out.Value, randomBytes(4*limit)...) // random: compressed, it stays too large
		}
		return Emit(ctx, out)
	})
	opts := []FlowOpt{DeadLetters(deadletter.NewKafkaSink(client)), MaxAttempts(2)}
	if !eos {
		opts = append(opts, Outputs())
	}
	if src.endsByItself || src.name == "share" || stopEarly {
		if !cl.mustRun(h, opts...) {
			return
		}
	} else {
		// A group's records are done once committed: under ExactlyOnce a
		// record's output and its offset land in one transaction, after
		// the handler returned (which is what the harness's hooks see).
		commits := newCommitsAtEnds(cl)
		run := cl.start(h, append(opts, WithHooks(commits))...)
		select {
		case <-commits.reached:
		case <-run.done:
			t.Fatalf("%s returned before its commit reached every end: %v", src.name, run.err)
		case <-time.After(flowBound):
			t.Errorf("the commit did not reach every partition's end within %v (%s): %s", flowBound, commits.short(), cl.unfinished())
		}
		if err := run.stop(); err != nil {
			t.Fatalf("%s: %v", src.name, err)
		}
	}

	// The ledger of the cell: lost, dead-lettered wrongly, outputs.
	var lost, wronglyDead []int
	for i, r := range cl.recs {
		handled, dead := cl.fin.counts(r)
		switch {
		case handled == 0 && dead == 0:
			lost = append(lost, i)
		case i != big && dead > 0:
			wronglyDead = append(wronglyDead, i)
		}
	}
	if _, dead := cl.fin.counts(cl.recs[big]); dead == 0 {
		t.Errorf("%s was not dead-lettered although its output is larger than the topic allows", cl.describe(big))
	}
	outs := readOutputs(t, cl.c, "out", n-1, 20*time.Second)
	per := map[[2]int64]int{}
	for _, o := range outs {
		p, off, _ := inputOf(o)
		per[[2]int64{int64(p), off}]++
	}
	var missing, dups int
	for i, r := range cl.recs {
		c := per[[2]int64{int64(r.Partition), r.Offset}]
		switch {
		case i == big && c != 0:
			t.Errorf("%s has %d outputs on its topic, want none (too large)", cl.describe(i), c)
		case i != big && c == 0:
			missing++
		case c > 1:
			dups += c - 1
		}
	}
	stalled := ""
	if src.name != "share" && !src.endsByItself {
		stalled = committedShortOfEnd(t, client, cl.group, cl.topic)
	}
	t.Logf("ledger: lost %d, wrongly dead-lettered %d, outputs missing %d, duplicate outputs %d, commit %s",
		len(lost), len(wronglyDead), missing, dups, map[bool]string{true: "at every end", false: "short: " + stalled}[stalled == ""])
	if len(lost) > 0 {
		t.Errorf("%d records lost, first %s", len(lost), cl.describe(lost[0]))
	}
	if len(wronglyDead) > 0 {
		t.Errorf("%d records dead-lettered wrongly, first %s", len(wronglyDead), cl.describe(wronglyDead[0]))
	}
	if missing > 0 {
		t.Errorf("%d records have no output", missing)
	}
	if eos && dups > 0 {
		t.Errorf("%d duplicate outputs under ExactlyOnce", dups)
	}
	if stalled != "" {
		t.Errorf("the commit stalled short of the end: %s", stalled)
	}
}

// stopEarlyEnv stops every group cell once its handler has seen every
// record, before the commit of the last ones landed, as the conformance
// rows do; the exactly-once cells run that way too ("stopped-early"),
// where the final transaction at the stop holds the output that does not
// fit.
const stopEarlyEnv = "KPAR_FAULTMATRIX_STOP_EARLY"

// dlqAutoCreateEnv leaves the dead-letter topic to auto-creation.
const dlqAutoCreateEnv = "KPAR_FAULTMATRIX_DLQ_AUTOCREATE"

// commitsAtEnds is a commit hook that closes reached once every partition
// of the cell's topic is committed up to its end.
type commitsAtEnds struct {
	ends    map[int32]int64
	mu      sync.Mutex
	got     map[int32]int64
	once    sync.Once
	reached chan struct{}
}

func newCommitsAtEnds(cl *cell) *commitsAtEnds {
	c := &commitsAtEnds{ends: map[int32]int64{}, got: map[int32]int64{}, reached: make(chan struct{})}
	for _, r := range cl.recs {
		c.ends[r.Partition] = max(c.ends[r.Partition], r.Offset+1)
	}
	return c
}

func (c *commitsAtEnds) OnCommit(offs map[string]map[int32]int64, err error) {
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ps := range offs {
		for p, o := range ps {
			c.got[p] = max(c.got[p], o)
		}
	}
	if c.shortLocked() == "" {
		c.once.Do(func() { close(c.reached) })
	}
}

func (c *commitsAtEnds) short() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shortLocked()
}

func (c *commitsAtEnds) shortLocked() string {
	s := ""
	for p, end := range c.ends {
		if c.got[p] < end {
			s += fmt.Sprintf(" p%d committed %d of %d", p, c.got[p], end)
		}
	}
	return s
}

// committedShortOfEnd returns "" when group's committed offsets reach
// every partition's end of topic, else the partitions short of it. The
// commit of the last records may trail their finish: it is awaited for up
// to 20s.
func committedShortOfEnd(t *testing.T, cl *kgo.Client, group, topic string) string {
	t.Helper()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ends, err := adm.ListEndOffsets(t.Context(), topic)
		if err != nil {
			t.Fatal(err)
		}
		offs, err := adm.FetchOffsets(t.Context(), group)
		if err != nil {
			t.Fatal(err)
		}
		short := ""
		ends.Each(func(e kadm.ListedOffset) {
			if o, ok := offs.Lookup(topic, e.Partition); !ok || o.At < e.Offset {
				short += fmt.Sprintf(" p%d committed %d of %d", e.Partition, o.At, e.Offset)
			}
		})
		if short == "" || time.Now().After(deadline) {
			return short
		}
		time.Sleep(100 * time.Millisecond) // polling the broker: a commit has no event to await here
	}
}
