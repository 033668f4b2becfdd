package kpar

import (
	"context"
	"fmt"
	"slices"
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
	"github.com/kpar/kpar/internal/offsetmeta"
	"github.com/kpar/kpar/internal/window"
)

// TestLostWorkJoinsTheCommittedFinishedSet: what a member finished on a
// partition it lost joins the finished set of the commit metadata when the
// partition comes back, above the committed offset only, and only once.
func TestLostWorkJoinsTheCommittedFinishedSet(t *testing.T) {
	k := tp{topic: "t", partition: 1}
	var l lostWork
	l.keep(k, []offsetmeta.Run{{From: 100, To: 250}, {From: 260, To: 270}})
	meta := []offsetmeta.Run{{From: 121, To: 130}, {From: 280, To: 290}}
	got := l.take(k, meta, 120)
	want := []offsetmeta.Run{{From: 120, To: 250}, {From: 260, To: 270}, {From: 280, To: 290}}
	if !slices.Equal(got, want) {
		t.Errorf("take = %v, want %v", got, want)
	}
	if got := l.take(k, meta, 120); !slices.Equal(got, meta) {
		t.Errorf("second take = %v, want the metadata's %v alone", got, meta)
	}
	l.keep(k, []offsetmeta.Run{{From: 0, To: 10}})
	l.forget("t")
	if got := l.take(k, nil, 0); got != nil {
		t.Errorf("take after forget = %v, want nothing", got)
	}
	l.keep(k, []offsetmeta.Run{{From: 0, To: 10}})
	if got := l.take(k, nil, 50); len(got) != 0 {
		t.Errorf("take above what was kept = %v, want nothing", got)
	}
}

// TestAWindowOfRecordsFinishedBeforeStillRefills: records the commit
// metadata (or work kept from a lost assignment) says were finished enter
// the window done, without running. When a whole window's worth of them
// entered after the last record that ran, nothing of the partition ran
// any more to move its held records in: the partition stalled with every
// record after them held (issue 35's broker-restart stall, where the first
// window after each reassignment was work finished before the loss). The
// records after them must be handled.
func TestAWindowOfRecordsFinishedBeforeStillRefills(t *testing.T) {
	const n, window = 200, 10
	c := newFakeCluster(t, notPorted, "refill", 1)
	l := invariant.New(invariant.ByKey, 0)
	produce(t, c, "refill", n, n, l.Produced)
	// Committed at 0 with 1..119 finished: record 0 runs, then twelve
	// windows' worth of records enter done.
	finished := []offsetmeta.Run{{From: 1, To: 120}}
	meta, covered := offsetmeta.Encode(ByKey.metaMode(), 0, finished, 4096)
	if covered != 1 {
		t.Fatalf("the metadata covers %d runs, want 1", covered)
	}
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: "refill", Partition: 0, At: 0, LeaderEpoch: -1, Metadata: meta})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if resp, err := adminClient(t, c).CommitOffsets(ctx, "refill", os); err != nil || resp.Error() != nil {
		t.Fatalf("pre-commit: %v %v", err, resp.Error())
	}

	want := int64(1 + n - 120)
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error { l.Handled(r); return nil })
	cons, err := New(h, append(testOpts(c, "refill", "refill"), WindowRecords(window))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, l.Reached(want), 30*time.Second, "record 0 and every record after the finished ones")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rep := l.Report(); rep.Handled != want || rep.Duplicates != 0 {
		t.Fatalf("%+v, want %d handled once each", rep, want)
	}
}

// lossHooks closes lost when the member loses partitions and back when
// it is assigned some after that.
type lossHooks struct {
	mu         sync.Mutex
	lost, back chan struct{}
	wasLost    bool
}

func (h *lossHooks) OnPartitionsAssigned(assigned map[string][]int32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wasLost && len(assigned) > 0 && h.back != nil {
		close(h.back)
		h.back = nil
	}
}

func (h *lossHooks) OnPartitionsRevoked(_ map[string][]int32, lost bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if lost && !h.wasLost {
		h.wasLost = true
		close(h.lost)
	}
}

// TestExactlyOnceKeepsTheOutputsOfALostPartition: with ExactlyOnce, a
// member that loses its partitions while no transaction commits keeps the
// records it finished and their outputs; given the partitions back with
// the commit unchanged, it handles none of those records again, and their
// outputs are committed with the offsets that cover them: each input's
// output is read exactly once, read_committed. Either every transaction's
// offset commit is refused until the partitions are back, or one
// transaction is in flight at the loss, holding outputs of the lost
// partitions, and refused (its member fenced) once the member rejoined:
// the assignment waits for it to give them back.
func TestExactlyOnceKeepsTheOutputsOfALostPartition(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight bool
		protocol Protocol
	}{
		{"offset commits refused", false, ClassicProtocol},
		{"a transaction in flight", true, ClassicProtocol},
		{"consumer protocol/offset commits refused", false, ConsumerProtocol},
	} {
		inFlight := tc.inFlight
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n = 400
			c := newFakeCluster(t, "injects broker faults", "in", 2)
			createTopic(t, c, "out", 2)
			l := invariant.New(invariant.ByKey, n)
			produce(t, c, "in", n/2, 20, l.Produced)
			h := emitThenRecord(l, "out")
			hooks := &lossHooks{lost: make(chan struct{}), back: make(chan struct{})}
			back := hooks.back
			cons, err := New(h, append(testOpts(c, "g", "in"), ExactlyOnce(), InstanceID("m1"), Concurrency(4), WithHooks(hooks), GroupProtocol(tc.protocol))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			awaitCommitted := func(what string) { awaitCommittedAtEnd(t, c, "g", "in", what) }
			waitFor(t, l.Reached(n/2), 30*time.Second, "the first half handled")
			awaitCommitted("the first half")

			// No transaction commits from here until the member rejoined.
			var refused *kfake.FaultHandle
			held, release, rejoined := make(chan struct{}), make(chan struct{}), make(chan struct{})
			if inFlight {
				// The next transaction's offset commit waits for the
				// member to rejoin, and is then refused: it commits
				// as the member that was.
				var first atomic.Bool
				c.ControlKey(kmsg.TxnOffsetCommit.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
					if first.CompareAndSwap(false, true) { // the one held; those behind it run as they come
						close(held)
						c.SleepControl(func() { <-release })
					}
					return nil, nil, false
				})
				var once sync.Once
				// The member's first OffsetFetch after the loss: it
				// rejoined, and is being assigned its partitions.
				c.ControlKey(kmsg.OffsetFetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
					c.KeepControl()
					select {
					case <-hooks.lost:
						once.Do(func() { close(rejoined) })
					default:
					}
					return nil, nil, false
				})
			} else {
				refusal := kerr.UnknownServerError
				if tc.protocol == ConsumerProtocol {
					refusal = kerr.FencedMemberEpoch // what a member the broker forgot is told
				}
				refused = c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.TxnOffsetCommit}, Err: refusal, Count: -1})
			}
			produceRange(t, c, "in", n/2, n, 20, l.Produced)
			waitFor(t, l.Reached(n), 30*time.Second, "every record handled, none committed")
			if inFlight {
				waitFor(t, held, 30*time.Second, "a transaction's offset commit")
			}
			if tc.protocol == ConsumerProtocol {
				c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ConsumerGroupHeartbeat}, Err: kerr.FencedMemberEpoch})
			} else {
				c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Err: kerr.UnknownMemberID})
			}
			waitFor(t, hooks.lost, 30*time.Second, "the partitions lost")
			if refused != nil {
				// Nothing of the lost partitions can commit now. The
				// settler's next try finds nothing to commit and stops
				// trying: the records kept ask for the transaction of
				// their outputs themselves once they are back.
				refused.Remove()
			}
			if inFlight {
				waitFor(t, rejoined, 30*time.Second, "the member rejoined and reading its commits")
				close(release)
			}
			waitFor(t, back, 30*time.Second, "the partitions assigned again")
			awaitCommitted("every record")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if rep := l.Report(); rep.Handled != n || rep.Duplicates != 0 {
				t.Errorf("%+v: want each of the %d records handled once: those finished before the loss are finished still", rep, n)
			}
			checkOutputs(t, l, readOutputs(t, c, "out", n, 30*time.Second), true)
		})
	}
}

// TestExactlyOnceLostWorkNeedsTheCommitItKnew: what ExactlyOnce kept of a
// lost partition is taken only when the group's commit is still the one
// the member knew at the loss, offset and metadata: any other may hold
// the outputs of the kept records. The records whose outputs a
// transaction in flight at the loss held are finished only once it gave
// them back (aborted); the kept outputs are bounded.
func TestExactlyOnceLostWorkNeedsTheCommitItKnew(t *testing.T) {
	k := tp{topic: "t", partition: 1}
	old, now := &partState{tp: k}, &partState{tp: k}
	out := func(ps *partState, offset int64) pendingOutput {
		return pendingOutput{ps: ps, offset: offset, in: &kgo.Record{Offset: offset}, recs: []*kgo.Record{{Value: []byte("x")}}}
	}
	kept := func() *keptTxn {
		return &keptTxn{
			from: old, base: 100, baseMeta: "m",
			runs:    []offsetmeta.Run{{From: 100, To: 110}},
			outs:    []pendingOutput{out(old, 104), out(old, 101)},
			waiting: map[int64]struct{}{105: {}, 106: {}},
		}
	}
	for _, tc := range []struct {
		name string
		at   int64
		meta string
	}{{"another offset", 103, "m"}, {"other metadata", 100, "m2"}} {
		var l lostWork
		l.keepTxn(k, kept(), 1<<20)
		if runs, kept := l.takeTxn(k, now, nil, tc.at, tc.meta); runs != nil || kept != nil {
			t.Errorf("%s: take = %v %+v, want nothing", tc.name, runs, kept)
		}
	}

	var l lostWork
	l.keepTxn(k, kept(), 1<<20)
	l.returned([]pendingOutput{out(old, 105), out(now, 106), out(old, 107)}, 1<<20)
	runs, back := l.takeTxn(k, now, []offsetmeta.Run{{From: 120, To: 130}}, 100, "m")
	if want := []offsetmeta.Run{{From: 100, To: 106}, {From: 107, To: 110}, {From: 120, To: 130}}; !slices.Equal(runs, want) {
		t.Errorf("take = %v, want %v: 106 is still in the transaction", runs, want)
	}
	var offs []int64
	for _, o := range back.outs {
		offs = append(offs, o.offset)
		if o.ps != now {
			t.Errorf("output of %d names the lost state, want the new one", o.offset)
		}
	}
	if want := []int64{101, 104, 105}; !slices.Equal(offs, want) {
		t.Errorf("outputs of %v, want %v in offset order", offs, want)
	}
	if l.txnBytes != 0 {
		t.Errorf("%d bytes left kept after the take", l.txnBytes)
	}

	l.keepTxn(k, kept(), 10)
	if runs, _ := l.takeTxn(k, now, nil, 100, "m"); runs != nil {
		t.Errorf("take = %v, want nothing kept past the bound", runs)
	}
}

// TestExactlyOnceRegainsTheOutputsOfAnAbortedTransaction: a transaction
// in flight when the member lost a partition may abort only after the
// partition came back. Its outputs of records that have not entered the
// window yet make those records finished after all, their outputs waiting
// for the transaction that commits them; a record that entered already
// runs again, and so does one whose output became a dead letter. The
// outputs of a partition not assigned again go back to what was kept of
// it. A kept output that joins those waiting asks for a transaction.
func TestExactlyOnceRegainsTheOutputsOfAnAbortedTransaction(t *testing.T) {
	k, other := tp{topic: "t", partition: 1}, tp{topic: "t", partition: 2}
	old, otherOld := &partState{tp: k, status: dropped}, &partState{tp: other, status: dropped}
	ps := &partState{tp: k, win: window.New(16), skip: []offsetmeta.Run{{From: 100, To: 105}}}
	ps.kept = &regained{from: old, waiting: map[int64]struct{}{103: {}, 106: {}, 107: {}}}
	for off := int64(100); off < 105; off++ {
		ps.finishedBefore(off)
		ps.win.Done(ps.win.Push(off))
	}
	e := &engine{parts: map[tp]*partState{k: ps}}
	e.commitWake = make(chan struct{}, 1)
	out := func(ps *partState, offset int64, kind outputKind) pendingOutput {
		return pendingOutput{ps: ps, offset: offset, kind: kind, in: &kgo.Record{Offset: offset}}
	}
	rest := e.regain([]pendingOutput{out(old, 103, outHandler), out(old, 106, outHandler), out(old, 107, outDeadLetter), out(otherOld, 7, outHandler)})
	if len(rest) != 1 || rest[0].ps != otherOld {
		t.Errorf("rest = %+v, want the output of the partition not assigned again", rest)
	}
	if want := []offsetmeta.Run{{From: 100, To: 105}, {From: 106, To: 107}}; !slices.Equal(ps.skip, want) {
		t.Errorf("skip = %v, want %v: 103 entered already, 107 is a dead letter now", ps.skip, want)
	}
	if len(ps.kept.waiting) != 0 {
		t.Errorf("still waiting for %v", ps.kept.waiting)
	}
	for off := int64(105); off < 108; off++ {
		if ps.finishedBefore(off) {
			ps.win.Done(ps.win.Push(off))
			e.keptOutputsAt(ps, off)
		} else {
			ps.win.Push(off)
		}
	}
	if len(e.pendingOutputs) != 1 || e.pendingOutputs[0].offset != 106 || e.pendingOutputs[0].ps != ps {
		t.Errorf("outputs waiting for a transaction: %+v, want 106's, of the partition as assigned again", e.pendingOutputs)
	}
	select {
	case <-e.commitWake:
	default:
		t.Error("no commit asked for the outputs of a record that entered finished: nothing else may finish to ask it")
	}
	if ps.kept != nil {
		t.Errorf("kept %+v after every record entered, want nothing", ps.kept)
	}
}

// TestAMemberLostTwiceBeforeACommitLandsKeepsWhatItFinished: a member that
// loses its partitions (the broker forgot it: fenced), gets them back and
// finishes more records, then loses them again before any commit of the
// new assignment landed, keeps all it finished for when they come back the
// second time. It kept only what lay above its own last commit or the
// committed offset read at assignment, and the first fetch forgets the
// latter: the second loss kept nothing and every record since the last
// commit that landed ran again (issue 35: kill -9 restarts of kpar broker
// under a consumer-protocol member, thousands of duplicates, the committed
// offset seemingly back where it was two restarts earlier).
func TestAMemberLostTwiceBeforeACommitLandsKeepsWhatItFinished(t *testing.T) {
	const topic, group, keys = "lost-twice", "lost-twice", 10
	c := newFakeCluster(t, "fences the member and refuses its commits", topic, 1)
	l, cons, rebalances, commits, stop := runSignalledMember(t, c, group, topic)
	produced := 0
	produceTo := func(n int) {
		t.Helper()
		produceRange(t, c, topic, produced, n, keys, l.Produced)
		produced = n
		waitFor(t, l.Reached(int64(n)), 30*time.Second, fmt.Sprintf("records up to %d handled", n))
	}
	produceTo(100)
	waitPartition(t, cons, commits, "the first 100 records committed", func(s PartitionStats) bool { return s.Committed == 100 })
	await(t, rebalances.assigned, "the first assignment")

	refused := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.UnknownMemberID, Count: -1})
	fence := func(what string) {
		t.Helper()
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ConsumerGroupHeartbeat}, Group: group, Err: kerr.FencedMemberEpoch})
		await(t, rebalances.lost, what+": partitions lost")
		await(t, rebalances.assigned, what+": partitions assigned again")
	}
	produceTo(300)
	fence("first fence") // kept: 100 to 300, above its own last commit
	produceTo(500)       // 100 to 300 skipped, 300 to 500 handled; no commit lands
	fence("second fence")
	produceTo(550) // after 100 to 500, finished before and kept, come again

	refused.Remove()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rep := l.Report(); rep.Duplicates != 0 || rep.Lost != 0 || rep.Handled != 550 {
		t.Fatalf("%+v, want 550 records handled once each", rep)
	}
}

// runSignalledMember runs a consumer-protocol member of group on topic
// whose handler records into a ledger, with a signal for each of its
// rebalances and commits.
func runSignalledMember(t *testing.T, c *kfake.Cluster, group, topic string) (l *invariant.Ledger, cons *Consumer, rebalances *rebalanceSignal, commits <-chan struct{}, stop func() error) {
	t.Helper()
	l = invariant.New(invariant.ByKey, 0)
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error { l.Handled(r); return nil })
	rebalances = &rebalanceSignal{assigned: make(chan struct{}, 8), lost: make(chan struct{}, 8)}
	commitHook, commits := commitSignal()
	cons, err := New(h, append(testOpts(c, group, topic), GroupProtocol(ConsumerProtocol), WithHooks(rebalances, commitHook))...)
	if err != nil {
		t.Fatal(err)
	}
	return l, cons, rebalances, commits, runConsumer(t, cons)
}

// rebalanceSignal signals each assignment and each loss of partitions.
type rebalanceSignal struct{ assigned, lost chan struct{} }

func (s *rebalanceSignal) OnPartitionsAssigned(assigned map[string][]int32) {
	if len(assigned) > 0 {
		s.assigned <- struct{}{}
	}
}

func (s *rebalanceSignal) OnPartitionsRevoked(_ map[string][]int32, lost bool) {
	if lost {
		s.lost <- struct{}{}
	}
}

// await waits for one signal on ch, failing the test after 30s.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	waitFor(t, ch, 30*time.Second, what)
}

// TestALostPartitionKeepsFinishedOffsetsNotFetchedAgainYet: the finished
// offsets read at assignment (the commit metadata, work kept from an
// earlier loss) whose records were not fetched again before the partition
// was lost once more are still finished, and kept.
func TestALostPartitionKeepsFinishedOffsetsNotFetchedAgainYet(t *testing.T) {
	ps := &partState{win: window.New(8), committed: -1, resumeAt: 100, firstAdmitted: -1,
		skip: []offsetmeta.Run{{From: 100, To: 300}, {From: 310, To: 320}}}
	want := []offsetmeta.Run{{From: 100, To: 300}, {From: 310, To: 320}}
	if got := finishedOf(ps); !slices.Equal(got, want) {
		t.Errorf("nothing fetched yet: finishedOf = %v, want %v", got, want)
	}
}

// TestExactlyOnceLostWorkFollowsTheMembersOwnCommit: a transaction in
// flight when the member lost a partition that then commits makes the
// group's commit the member's own: what was kept of the partition holds
// still above it, and the records whose outputs the transaction held are
// committed. The new commit dropped everything kept, and the records
// finished during a broker outage ran again (3,008 duplicates in a soak
// run of the fault matrix).
func TestExactlyOnceLostWorkFollowsTheMembersOwnCommit(t *testing.T) {
	k := tp{topic: "t", partition: 0}
	old := &partState{tp: k, status: dropped}
	out := func(offset int64) pendingOutput {
		return pendingOutput{ps: old, offset: offset, kind: outHandler, in: &kgo.Record{Offset: offset}}
	}
	keep := func() *lostWork {
		l := &lostWork{}
		l.keepTxn(k, &keptTxn{
			from: old, base: 90, baseMeta: "at 90",
			runs:    []offsetmeta.Run{{From: 90, To: 110}},
			outs:    []pendingOutput{out(105), out(108)},
			waiting: map[int64]struct{}{100: {}, 101: {}, 102: {}}, // in the transaction
		}, 1<<20)
		return l
	}
	ps := &partState{tp: k}
	landed := []commitPart{{ps: old, offset: 103, meta: "at 103"}}

	l := keep()
	l.landed(landed)
	skip, g := l.takeTxn(k, ps, nil, 103, "at 103")
	if want := []offsetmeta.Run{{From: 103, To: 110}}; !slices.Equal(skip, want) {
		t.Errorf("skip = %v, want %v: finished above the member's own commit", skip, want)
	}
	if g == nil || len(g.outs) != 2 || g.outs[0].offset != 105 || g.outs[1].offset != 108 || len(g.waiting) != 0 {
		t.Errorf("kept = %+v, want the outputs of 105 and 108, nothing waiting", g)
	}

	// Another commit (not the transaction's) still drops it all.
	l = keep()
	l.landed(landed)
	if skip, g := l.takeTxn(k, ps, nil, 104, "at 104"); len(skip) != 0 || g != nil {
		t.Errorf("another commit kept %v and %+v, want nothing", skip, g)
	}
}
