package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kpar/kpar"
)

// Readiness from the partitions this member does not own. A member's own
// progress says nothing of the records that wait on another member's
// partitions: after a kill -9 with the consumer protocol (KIP-848), the
// dead member keeps its partitions until its session times out, and its
// restarted successor, owning none or some of them, finishes everything
// it has and is idle while the rest of the group's records wait. So the
// sampler also lists, every orphanInterval, the group's committed offsets
// and the end offsets of the consumed topics' partitions this member does
// not own. A partition whose records wait (lag) while its committed offset
// and metadata (kpar commits the records finished above the offset there)
// did not move for the stall grace is one whose records nobody finishes:
// its owner is gone or stalled, or it has none. The member is not ready
// while there is one, and says which. Share groups are not concerned:
// their lag is the group's already (readiness.go).

// unownedPart is a partition of the consumed topics that this member does
// not own: its records waiting, and its commit as the group last stored
// it.
type unownedPart struct {
	topic     string
	partition int32
	lag       int64
	committed string // offset and metadata: a change is progress
}

// orphanWatch tracks how long the unowned partitions' records have waited
// without their commits moving. check runs on the sampler's goroutine and
// stalled on /readyz's.
type orphanWatch struct {
	checked time.Time // the sampler's own

	mu    sync.Mutex // guards parts; held for bookkeeping only
	parts map[topicPartition]orphanSeen
}

// orphanSeen is an unowned partition with lag: its commit and since when
// it has not moved.
type orphanSeen struct {
	lag       int64
	committed string
	since     time.Time
}

// orphanInterval is how often the sampler lists the unowned partitions:
// the grace, within sampleInterval and lagInterval, so that a stall is
// seen about a grace after it starts without listing offsets every
// second under a long grace.
func orphanInterval(grace time.Duration) time.Duration {
	return min(max(grace, sampleInterval), lagInterval)
}

// check lists the unowned partitions through list, when it is time to,
// and notes which of them wait without their commits moving. owned is
// what this member holds. Called by the sampler only, never under a lock
// while listing.
func (o *orphanWatch) check(ctx context.Context, now time.Time, grace time.Duration, owned []kpar.PartitionStats,
	list func(ctx context.Context, owned []kpar.PartitionStats) ([]unownedPart, bool)) {
	if list == nil || now.Sub(o.checked) < orphanInterval(grace) {
		return
	}
	o.checked = now
	lctx, cancel := context.WithTimeout(ctx, lagTimeout)
	parts, ok := list(lctx, owned)
	cancel()
	o.mu.Lock()
	defer o.mu.Unlock()
	if !ok {
		// Unknown is not stalled: claim nothing until a listing works.
		// (A broker outage has its own message: brokerwatch.go.)
		o.parts = nil
		return
	}
	next := make(map[topicPartition]orphanSeen, len(parts))
	for _, p := range parts {
		if p.lag <= 0 {
			continue
		}
		k := topicPartition{topic: p.topic, p: p.partition}
		seen, known := o.parts[k]
		if !known || seen.committed != p.committed {
			seen = orphanSeen{committed: p.committed, since: now}
		}
		seen.lag = p.lag
		next[k] = seen
	}
	o.parts = next
}

// stalled reports the unowned partitions whose records waited with no
// commit moving them for grace or longer, and says which.
func (o *orphanWatch) stalled(now time.Time, grace time.Duration) (string, bool) {
	o.mu.Lock()
	var (
		waiting int64
		oldest  time.Time
		named   []topicPartition
	)
	for k, seen := range o.parts {
		if now.Sub(seen.since) < grace {
			continue
		}
		waiting += seen.lag
		named = append(named, k)
		if oldest.IsZero() || seen.since.Before(oldest) {
			oldest = seen.since
		}
	}
	o.mu.Unlock()
	if len(named) == 0 {
		return "", false
	}
	slices.SortFunc(named, func(a, b topicPartition) int {
		if c := strings.Compare(a.topic, b.topic); c != 0 {
			return c
		}
		return int(a.p - b.p)
	})
	var b strings.Builder
	for i, k := range named {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s/%d", k.topic, k.p)
	}
	return fmt.Sprintf("%d records waiting on partitions this member does not own (%s), and no commit moved them for %v: their owner is gone (a killed member keeps its partitions until its session times out), stalled, or missing",
		waiting, b.String(), now.Sub(oldest).Round(time.Second)), true
}

// orphansReady is ready's answer once this member's own work is judged
// ready (ok, why): not ready while unowned partitions stall.
func (p *stallWatch) orphansReady(ok bool, why string) (bool, string) {
	if stalledWhy, stalled := p.orphans.stalled(time.Now(), p.grace); stalled {
		return false, stalledWhy
	}
	return ok, why
}

// unowned is work.unowned through the Consumer's client: the consumed
// topics' partitions not in owned, with their lag (end offset minus the
// group's committed offset, or the start offset where none is committed)
// and their commit. A share group has none (false).
func (p *stallWatch) unowned(ctx context.Context, owned []kpar.PartitionStats) ([]unownedPart, bool) {
	gc := p.cl.Load()
	if gc == nil || gc.share {
		return nil, false
	}
	topics := gc.cl.GetConsumeTopics()
	if len(topics) == 0 {
		return nil, true
	}
	mine := make(map[topicPartition]bool, len(owned))
	for _, s := range owned {
		mine[topicPartition{topic: s.Topic, p: s.Partition}] = true
	}
	adm := kadm.NewClient(gc.cl)
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, false
	}
	committed, err := adm.FetchOffsets(ctx, gc.group)
	if err != nil {
		return nil, false
	}
	var (
		starts kadm.ListedOffsets
		out    []unownedPart
		failed bool
	)
	ends.Each(func(end kadm.ListedOffset) {
		if failed || mine[topicPartition{topic: end.Topic, p: end.Partition}] {
			return
		}
		if end.Err != nil {
			failed = true
			return
		}
		part := unownedPart{topic: end.Topic, partition: end.Partition}
		from := int64(-1)
		if c, ok := committed.Lookup(end.Topic, end.Partition); ok && c.Err == nil && c.At >= 0 {
			from = c.At
			part.committed = fmt.Sprintf("%d %s", c.At, c.Metadata)
		}
		if from < 0 { // nothing committed: the group starts at the oldest record
			if starts == nil {
				if starts, err = adm.ListStartOffsets(ctx, topics...); err != nil {
					failed = true
					return
				}
			}
			start, ok := starts.Lookup(end.Topic, end.Partition)
			if !ok || start.Err != nil {
				failed = true
				return
			}
			from = start.Offset
		}
		part.lag = max(end.Offset-from, 0)
		out = append(out, part)
	})
	return out, !failed
}
