package kpar

import (
	"slices"
	"sync"

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

// lostWork is the finished offsets of lost partitions, kept until they are
// assigned again. Its own lock: the rebalance callbacks run on the
// client's goroutines; taken after engine.mu is released.
type lostWork struct {
	mu sync.Mutex
	m  map[tp][]offsetmeta.Run // sorted, not touching
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
	runs := mergeRuns(from, kept)
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
