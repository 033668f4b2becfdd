package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kpar/kpar/internal/ledger"
)

// The chaos tests measure from outside the members' processes how long
// a group went without committing.

// handlings counts the successful handlings in l so far, duplicates
// included: watchCommits' handled.
func handlings(l *ledger.Ledger) func() int64 {
	return func() int64 { r := l.Report(); return r.Handled + r.Duplicates }
}

// commitWatch measures how long a group goes without committing, from
// outside its members' processes (a HookCommit sees one process only): it
// reads the group's committed offsets and the topic's end offsets from the
// broker every commitPoll, and notes each time any partition's committed
// offset advanced. A gap is the time between two observed advances while
// some partition had records past its committed offset (pending); time
// with nothing pending is not counted. The first gap starts at the first
// advance, so the members' first join is not one.
type commitWatch struct {
	began time.Time
	stop  context.CancelFunc
	done  chan struct{}
	first chan struct{} // closed at the first observed advance

	mu   sync.Mutex  // guards gaps, max and last
	gaps []commitGap // every gap of a second or more, and the longest
	max  commitGap
	last struct {
		uncommitted int64 // records past the commits when the watch stopped
		err         error // reading them failed
	}
}

// commitPoll is how often commitWatch reads the group's offsets.
const commitPoll = 100 * time.Millisecond

// commitGap is one stretch without an advance of the group's commits.
type commitGap struct {
	From, To time.Duration // since the watch began
	// Handled is how many successful handlings (duplicates included)
	// the endpoint answered during the gap: records the members handled
	// but could not commit, or none when only a dead member's partitions
	// were pending.
	Handled int64
}

func (g commitGap) Len() time.Duration { return g.To - g.From }

func (g commitGap) String() string {
	return fmt.Sprintf("%v (at %v-%v, %d handled meanwhile)", g.Len().Round(10*time.Millisecond),
		g.From.Round(100*time.Millisecond), g.To.Round(100*time.Millisecond), g.Handled)
}

// watchCommits starts watching group's commits on topic; handled counts
// the successful handlings so far (the ledger's Handled plus
// Duplicates). Stop it with stop; the test's end stops it too.
func watchCommits(ctx context.Context, t *testing.T, addr, group, topic string, handled func() int64) *commitWatch {
	t.Helper()
	cl := newClient(t, addr)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithCancel(ctx)
	w := &commitWatch{began: time.Now(), stop: cancel, done: make(chan struct{}), first: make(chan struct{})}
	t.Cleanup(func() { cancel(); <-w.done })
	go func() {
		defer close(w.done)
		defer cl.Close()
		tick := time.NewTicker(commitPoll)
		defer tick.Stop()
		seen := map[int32]int64{}
		var (
			started    bool          // an advance was observed
			from       time.Duration // the current gap's start
			atFrom     int64         // handled at its start
			wasPending bool          // records were pending at the last poll
		)
		for {
			select {
			case <-ctx.Done():
				if started && wasPending {
					w.note(commitGap{From: from, To: time.Since(w.began), Handled: handled() - atFrom})
				}
				w.readLast(context.WithoutCancel(ctx), adm, group, topic)
				return
			case <-tick.C:
			}
			offsets, err := readOffsets(ctx, adm, group, topic)
			if err != nil {
				continue // a coordinator moving, the broker busy: the next poll
			}
			now, h := time.Since(w.began), handled()
			advanced, pending := false, false
			for p, o := range offsets {
				if o.committed > seen[p] {
					advanced = true
				}
				seen[p] = o.committed
				if o.end > o.committed {
					pending = true
				}
			}
			switch {
			case advanced && !started:
				started = true
				close(w.first)
			case advanced:
				w.note(commitGap{From: from, To: now, Handled: h - atFrom})
			case !pending || !wasPending:
				// Nothing to commit: no gap runs, or one starts now.
			default:
				wasPending = pending
				continue
			}
			from, atFrom, wasPending = now, h, pending
		}
	}()
	return w
}

// partitionOffsets is a partition's committed offset (0 for none) and its
// end offset.
type partitionOffsets struct{ committed, end int64 }

// readOffsets reads group's commits and the end offsets of topic.
func readOffsets(ctx context.Context, adm *kadm.Client, group, topic string) (map[int32]partitionOffsets, error) {
	committed, err := adm.FetchOffsets(ctx, group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return nil, err
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, err
	}
	out := make(map[int32]partitionOffsets)
	ends.Each(func(o kadm.ListedOffset) {
		var at int64
		if c, ok := committed.Lookup(topic, o.Partition); ok && c.At > 0 {
			at = c.At
		}
		out[o.Partition] = partitionOffsets{committed: at, end: o.Offset}
	})
	return out, nil
}

// readLast notes, once the watch stops, how many records lie past the
// group's commits: what a restart would deliver again.
func (w *commitWatch) readLast(ctx context.Context, adm *kadm.Client, group, topic string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	offsets, err := readOffsets(ctx, adm, group, topic)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last.err = err
	for _, o := range offsets {
		w.last.uncommitted += max(o.end-o.committed, 0)
	}
}

func (w *commitWatch) note(g commitGap) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if g.Len() > w.max.Len() {
		w.max = g
	}
	if g.Len() >= time.Second {
		w.gaps = append(w.gaps, g)
	}
}

// since is the time since the watch began, for the test's event log.
func (w *commitWatch) since() time.Duration { return time.Since(w.began).Round(100 * time.Millisecond) }

// firstCommit is closed once the group's first commit was seen.
func (w *commitWatch) firstCommit() <-chan struct{} { return w.first }

// commitReport is what a commitWatch saw.
type commitReport struct {
	Longest commitGap   // the longest gap
	Gaps    []commitGap // every gap of a second or more
	// Uncommitted is the records past the group's commits when the watch
	// stopped: at the end of a test, what a restart would deliver again.
	Uncommitted int64
}

// result stops the watch (stop the members first: it reads the commits
// one last time) and returns what it saw.
func (w *commitWatch) result(t *testing.T) commitReport {
	t.Helper()
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last.err != nil {
		t.Fatalf("reading the group's commits at the end: %v", w.last.err)
	}
	return commitReport{Longest: w.max, Gaps: w.gaps, Uncommitted: w.last.uncommitted}
}

// gapsString lists gaps for a test log.
func gapsString(gaps []commitGap) string {
	s := make([]string, len(gaps))
	for i, g := range gaps {
		s[i] = g.String()
	}
	return "[" + strings.Join(s, "; ") + "]"
}
