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

	mu   sync.Mutex  // guards gaps
	gaps []commitGap // every gap of a second or more, and the longest
	max  commitGap
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
				return
			case <-tick.C:
			}
			committed, err := adm.FetchOffsets(ctx, group)
			if err == nil {
				err = committed.Error()
			}
			ends, err2 := adm.ListEndOffsets(ctx, topic)
			if err != nil || err2 != nil {
				continue // a coordinator moving, the broker busy: the next poll
			}
			now, h := time.Since(w.began), handled()
			advanced, pending := false, false
			ends.Each(func(o kadm.ListedOffset) {
				at := int64(0)
				if c, ok := committed.Lookup(topic, o.Partition); ok && c.At > 0 {
					at = c.At
				}
				if at > seen[o.Partition] {
					advanced = true
				}
				seen[o.Partition] = at
				if o.Err == nil && o.Offset > at {
					pending = true
				}
			})
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

// result stops the watch and returns the longest gap and every gap of a
// second or more.
func (w *commitWatch) result() (longest commitGap, long []commitGap) {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max, w.gaps
}

// gapsString lists gaps for a test log.
func gapsString(gaps []commitGap) string {
	s := make([]string, len(gaps))
	for i, g := range gaps {
		s[i] = g.String()
	}
	return "[" + strings.Join(s, "; ") + "]"
}
