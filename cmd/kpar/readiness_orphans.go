package main

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Readiness from the partitions this member does not own. A member's own
// progress says nothing of the records that wait on another member's
// partitions: after a kill -9 with the consumer protocol (KIP-848), the
// dead member keeps its partitions until its session times out, and its
// restarted successor, owning none or some of them, finishes everything
// it has and is idle while the rest of the group's records wait. So the
// sampler also lists, every orphanInterval, the group's committed offsets
// and the end offsets of the consumed topics' partitions this member does
// not own (in the lag's listing: readiness_listing.go). A partition whose records wait (lag) while its committed offset
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
// without their commits moving. due and note run on the sampler's
// goroutine and stalled on /readyz's.
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

// due says whether it is time to list the unowned partitions again. Called
// by the sampler only.
func (o *orphanWatch) due(now time.Time, grace time.Duration) bool {
	return now.Sub(o.checked) >= orphanInterval(grace)
}

// note takes the unowned partitions listed at now (parts; ok false when
// unknown), and notes which of them wait without their commits moving.
// Called by the sampler only, after listing.
func (o *orphanWatch) note(now time.Time, parts []unownedPart, ok bool) {
	o.checked = now
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
