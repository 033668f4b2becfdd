package kpar

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kpar/kpar/internal/offsetmeta"
)

// Finished work of lost partitions. A member loses its partitions without
// a commit when the group no longer knows it: its session expired, or the
// coordinator restarted and forgot it (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH;
// with the consumer protocol, the member keeps fetching and finishing
// records until a heartbeat or commit is refused, about a second after a
// broker restart). What it finished since its last commit that landed
// cannot be committed any more, and was delivered again when it rejoined:
// 940 duplicates after one broker restart (issue 35).
//
// The member remembers, per lost partition, the offsets it finished above
// the last committed offset it knew: the run from there (or from the first
// record the assignment admitted, when none of its commits landed) to the
// window start, the finished runs above it, and the finished offsets it
// was told of at assignment whose records had not come again yet. When
// the partition is assigned to it again in the same Run, those offsets
// join the finished set read from the commit metadata, and their records
// are finished without running, as a new owner skips what the metadata
// lists. Another member that gets
// the partition meanwhile cannot know them, which is the bound the design
// already states (what finished within one commit spacing).

// With ExactlyOnce the finished records' outputs were in a transaction that
// aborted, or that never began: skipping the records would lose their
// outputs. So the member keeps them too (keptTxn), with the committed
// offset and metadata it knew at the loss. When the partition comes back
// with exactly that commit (nobody committed it meanwhile: no transaction
// holds outputs of these records), the records enter the window finished,
// and each one's kept outputs join the outputs waiting for a transaction
// as it enters (keptOutputsAt): the transaction that carries them commits
// the window, which then covers their inputs, as for a record that just
// ran. Another commit (the member's own transaction landed after all, or
// another member handled the partition) drops what was kept: those
// records run again, as before. The outputs a transaction in flight at the
// loss held are kept once it aborted without asking to commit (returned,
// or regain when the partition came back first: the assignment waits up to
// lostOutputsWait for it). Not kept, so run again: the records of a batch
// handler (a batch's outputs are the batch's), those whose outputs are a
// dead letter or a retry-topic record, and those whose transaction asked to
// commit and failed (it may have committed after all). The kept outputs are
// bounded by MaxBufferedBytes, in all.

// lostWork is the finished offsets of lost partitions, kept until they are
// assigned again. Its own lock, the innermost: the rebalance callbacks run
// on the client's goroutines, the settler hands it the outputs of an
// aborted transaction; taken after engine.mu is released.
type lostWork struct {
	mu sync.Mutex
	m  map[tp][]offsetmeta.Run // sorted, not touching
	// txn is what ExactlyOnce kept, txnBytes the size of its outputs.
	txn      map[tp]*keptTxn
	txnBytes int64
}

// keptTxn is what ExactlyOnce keeps of a lost partition.
type keptTxn struct {
	from     *partState       // the lost state: the outputs of an aborted transaction name it
	base     int64            // the committed offset the member knew at the loss
	baseMeta string           // and its metadata
	runs     []offsetmeta.Run // finished above base: their outputs are in outs, waiting, or they had none
	outs     []pendingOutput
	bytes    int64
	// waiting are the offsets whose outputs a transaction in flight at
	// the loss held: finished only once it aborted and gave them back.
	waiting map[int64]struct{}
}

// keptTxnOf is what ExactlyOnce keeps of ps, lost: nil when nothing can
// be. Called with engine.mu held.
func (g *groupSource) keptTxnOf(ps *partState) *keptTxn {
	e := g.e
	base := ps.committedAt
	if e.cfg.batch || base < 0 {
		return nil
	}
	runs := finishedOf(ps)
	if len(runs) == 0 {
		return nil
	}
	w := &keptTxn{from: ps, base: base, baseMeta: ps.committedText}
	var drop []int64
	for _, o := range e.pendingOutputs {
		switch {
		case o.ps != ps:
		case o.kind != outHandler:
			drop = append(drop, o.offset)
		default:
			w.outs = append(w.outs, o)
		}
	}
	if ps.kept != nil {
		// Kept from the loss before, their records not back yet: in
		// skip, so in runs.
		w.outs = append(w.outs, ps.kept.outs...)
	}
	for _, o := range g.inTxn {
		if o.ps == ps {
			if w.waiting == nil {
				w.waiting = make(map[int64]struct{})
			}
			w.waiting[o.offset] = struct{}{}
		}
	}
	w.runs = withoutOffsets(runs, drop)
	return w
}

// size is what kept outputs count against the bound: the records and the
// input refit may need.
func (o *pendingOutput) size() int64 {
	n := recordSize(o.in)
	for _, r := range o.recs {
		n += recordSize(r)
	}
	return n
}

// keepTxn remembers w for k, in place of what was kept of it before,
// unless its outputs would pass limit bytes with the others kept.
func (l *lostWork) keepTxn(k tp, w *keptTxn, limit int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if old := l.txn[k]; old != nil {
		l.txnBytes -= old.bytes
		delete(l.txn, k)
	}
	if w == nil {
		return
	}
	w.bytes = 0
	for i := range w.outs {
		w.bytes += w.outs[i].size()
	}
	if l.txnBytes+w.bytes > limit {
		return
	}
	if l.txn == nil {
		l.txn = make(map[tp]*keptTxn)
	}
	l.txn[k] = w
	l.txnBytes += w.bytes
}

// returned takes back the outputs of an aborted transaction whose
// partitions were lost while it ran: each finishes its record in what was
// kept of the partition, if that is still there. The rest are dropped:
// their records run again. limit bounds the kept outputs as in keepTxn.
func (l *lostWork) returned(outs []pendingOutput, limit int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range outs {
		w := l.txn[o.ps.tp]
		if w == nil || w.from != o.ps || o.kind != outHandler {
			continue // a refit made it a dead letter: the record runs again
		}
		if _, ok := w.waiting[o.offset]; !ok || l.txnBytes+o.size() > limit {
			continue
		}
		delete(w.waiting, o.offset)
		w.outs = append(w.outs, o)
		w.bytes += o.size()
		l.txnBytes += o.size()
	}
}

// landed moves what was kept of the partitions lost while a transaction
// ran, which then committed todo, onto that commit: the group's commit is
// the member's own, so what it finished above it holds still, and the
// records whose outputs the transaction held are committed with it. Else
// the new commit dropped everything kept, and the records finished during
// a broker outage ran again (3,008 duplicates in a soak run).
func (l *lostWork) landed(todo []commitPart) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range todo {
		if w := l.txn[p.ps.tp]; w != nil && w.from == p.ps {
			w.base, w.baseMeta, w.waiting = p.offset, p.meta, nil
		}
	}
}

// takeTxn returns and forgets what ExactlyOnce kept of k, for ps, assigned
// again: the finished set of the commit metadata (from) with the kept
// offsets, and what ps keeps of them (nil for nothing). Only when the
// group's commit is still the one the member knew at the loss (committed,
// meta): any other commit may hold the outputs of these records.
func (l *lostWork) takeTxn(k tp, ps *partState, from []offsetmeta.Run, committed int64, meta string) ([]offsetmeta.Run, *regained) {
	l.mu.Lock()
	w := l.txn[k]
	if w != nil {
		delete(l.txn, k)
		l.txnBytes -= w.bytes
	}
	l.mu.Unlock()
	if w == nil || committed != w.base || meta != w.baseMeta {
		return from, nil
	}
	runs := withoutOffsets(w.runs, slices.Collect(maps.Keys(w.waiting)))
	out := mergeAbove(committed, from, runs)
	g := &regained{from: w.from, waiting: w.waiting}
	for _, o := range w.outs {
		if inRuns(out, o.offset) {
			o.ps = ps
			g.outs = append(g.outs, o)
		}
	}
	slices.SortStableFunc(g.outs, func(a, b pendingOutput) int { return cmp.Compare(a.offset, b.offset) })
	if len(g.outs) == 0 && len(g.waiting) == 0 {
		g = nil
	}
	return out, g
}

// awaitLostOutputs waits, up to lostOutputsWait, for the transaction in
// flight when the member lost some of assigned to end, when it held
// outputs of theirs: aborted, it gives them back (returned), and their
// records need not run again. Called by onAssigned, without engine.mu: the
// transaction takes it to end, and calls nothing that waits for the
// group's callbacks.
func (g *groupSource) awaitLostOutputs(ctx context.Context, assigned map[string][]int32) {
	if !g.lost.waiting(assigned) {
		return
	}
	g.e.mu.Lock()
	ended := g.txnEnded
	g.e.mu.Unlock()
	if ended == nil {
		return
	}
	t := time.NewTimer(lostOutputsWait)
	defer t.Stop()
	select {
	case <-ended:
	case <-t.C:
	case <-ctx.Done():
	}
}

// lostOutputsWait bounds how long an assignment waits for the transaction
// that held outputs of its partitions when they were lost (after a broker
// outage it is refused within a round trip of the broker's return): past
// it, their records run again.
const lostOutputsWait = 5 * time.Second

// waiting reports whether what was kept of any of assigned waits for
// outputs a transaction in flight at the loss held.
func (l *lostWork) waiting(assigned map[string][]int32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for topic, ps := range assigned {
		for _, p := range ps {
			if w := l.txn[tp{topic: topic, partition: p}]; w != nil && len(w.waiting) > 0 {
				return true
			}
		}
	}
	return false
}

// regained is what a partition assigned again keeps of its loss
// (ExactlyOnce, partState.kept).
type regained struct {
	// outs are the outputs of records in skip, in offset order: they wait
	// for a transaction once their record enters (keptOutputsAt).
	outs []pendingOutput
	// from is the lost state, and waiting the offsets whose outputs the
	// transaction in flight at the loss still held when the partition
	// came back: if it aborts before their records enter, they enter
	// finished after all (regain).
	from    *partState
	waiting map[int64]struct{}
}

// keptOutputsAt puts the kept outputs of the record at offset, which just
// entered ps's window finished (skip), with the outputs waiting for a
// transaction, and asks for one: nothing else may finish to ask it (every
// record of the partition kept). It drops the outputs of offsets below it
// (records no longer there). Called with engine.mu held.
func (e *engine) keptOutputsAt(ps *partState, offset int64) {
	k := ps.kept
	for len(k.outs) > 0 && k.outs[0].offset <= offset {
		if o := k.outs[0]; o.offset == offset {
			e.pendingOutputs = append(e.pendingOutputs, o)
			e.askCommit()
		}
		k.outs[0] = pendingOutput{}
		k.outs = k.outs[1:]
	}
	if len(k.outs) == 0 && len(k.waiting) == 0 {
		ps.kept = nil
	}
}

// regain finishes, with their outputs, the records of partitions lost and
// assigned again whose outputs a transaction in flight at the loss held:
// it aborted without asking to commit (so none of outs is visible), and
// their records have not entered the window yet. It returns the outputs
// of partitions not assigned again yet, for what was kept of them
// (lostWork.returned). Called with engine.mu held.
func (e *engine) regain(outs []pendingOutput) (rest []pendingOutput) {
	for _, o := range outs {
		ps := e.parts[o.ps.tp]
		if ps == nil || ps.kept == nil || ps.kept.from != o.ps {
			rest = append(rest, o)
			continue
		}
		k := ps.kept
		if _, ok := k.waiting[o.offset]; !ok {
			continue
		}
		delete(k.waiting, o.offset)
		if o.kind != outHandler || ps.status != live || o.offset < ps.win.End() {
			continue // a dead letter now, or its record entered: it runs again
		}
		ps.skip = mergeRuns(ps.skip, []offsetmeta.Run{{From: o.offset, To: o.offset + 1}})
		o.ps = ps
		i, _ := slices.BinarySearchFunc(k.outs, o.offset, func(x pendingOutput, off int64) int { return cmp.Compare(x.offset, off) })
		k.outs = slices.Insert(k.outs, i, o)
	}
	return rest
}

// withoutOffsets is runs with the offsets in offs taken out.
func withoutOffsets(runs []offsetmeta.Run, offs []int64) []offsetmeta.Run {
	if len(offs) == 0 {
		return runs
	}
	offs = slices.Clone(offs)
	slices.Sort(offs)
	var out []offsetmeta.Run
	for _, r := range runs {
		for _, o := range offs {
			if o < r.From || o >= r.To {
				continue
			}
			if o > r.From {
				out = append(out, offsetmeta.Run{From: r.From, To: o})
			}
			r.From = o + 1
		}
		if r.From < r.To {
			out = append(out, r)
		}
	}
	return out
}

// inRuns reports whether offset is in one of runs.
func inRuns(runs []offsetmeta.Run, offset int64) bool {
	for _, r := range runs {
		if r.From <= offset && offset < r.To {
			return true
		}
	}
	return false
}

// finishedOf is what ps finished above the last committed offset it knows:
// the run up to the window start from the lowest of its own last commit,
// the committed offset read at assignment and the first record this
// assignment admitted, the finished runs above the window start, and the
// finished offsets read at assignment whose records have not come yet
// (skip). The first admitted record matters when no commit of this
// assignment landed: resumeAt is cleared by the first fetch, and a member
// the restarted broker forgot again before its first commit would keep
// nothing, handling the whole assignment's work again when the partition
// comes back (issue 35: thousands of duplicates over a few kill -9
// restarts of kpar broker, the commit seemingly back where it was two
// restarts earlier). Called with mu held.
func finishedOf(ps *partState) []offsetmeta.Run {
	runs := slices.Clone(ps.skip)
	start, ok := ps.win.Start()
	if !ok {
		return runs
	}
	from := max(ps.committed, ps.resumeAt)
	if ps.firstAdmitted >= 0 && (from < 0 || ps.firstAdmitted < from) {
		from = ps.firstAdmitted
	}
	if from >= 0 && from < start {
		runs = append(runs, offsetmeta.Run{From: from, To: start})
	}
	ps.win.EachFinishedRun(func(from, to int64) {
		runs = append(runs, offsetmeta.Run{From: from, To: to})
	})
	return runs
}

// keep remembers the finished offsets of a lost partition.
func (l *lostWork) keep(k tp, runs []offsetmeta.Run) {
	if len(runs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[tp][]offsetmeta.Run)
	}
	l.m[k] = mergeRuns(l.m[k], runs)
}

// take returns and forgets what was kept of k, merged with from (the
// finished set of the commit metadata) at or above committed.
func (l *lostWork) take(k tp, from []offsetmeta.Run, committed int64) []offsetmeta.Run {
	l.mu.Lock()
	kept := l.m[k]
	delete(l.m, k)
	l.mu.Unlock()
	if len(kept) == 0 {
		return from
	}
	return mergeAbove(committed, from, kept)
}

// forget drops what was kept of topic (deleted: its offsets name other
// records now).
func (l *lostWork) forget(topic string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.m {
		if k.topic == topic {
			delete(l.m, k)
		}
	}
	for k, w := range l.txn {
		if k.topic == topic {
			l.txnBytes -= w.bytes
			delete(l.txn, k)
		}
	}
}

// mergeAbove is mergeRuns(a, b) cut to the offsets at or above committed:
// what was finished below the group's commit is behind it already.
func mergeAbove(committed int64, a, b []offsetmeta.Run) []offsetmeta.Run {
	runs := mergeRuns(a, b)
	out := runs[:0]
	for _, r := range runs {
		if r.To <= committed {
			continue
		}
		r.From = max(r.From, committed)
		out = append(out, r)
	}
	return out
}

// mergeRuns is the union of two sets of runs, sorted, touching runs joined.
func mergeRuns(a, b []offsetmeta.Run) []offsetmeta.Run {
	all := append(slices.Clone(a), b...)
	slices.SortFunc(all, func(x, y offsetmeta.Run) int {
		switch {
		case x.From < y.From:
			return -1
		case x.From > y.From:
			return 1
		}
		return 0
	})
	var out []offsetmeta.Run
	for _, r := range all {
		if n := len(out); n > 0 && r.From <= out[n-1].To {
			out[n-1].To = max(out[n-1].To, r.To)
			continue
		}
		out = append(out, r)
	}
	return out
}
