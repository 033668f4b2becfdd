package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kpar/kpar"
)

// One listing of the group's offsets serves both readiness checks that need
// them: the lag of the assigned partitions (readiness.go) and the
// partitions this member does not own (readiness_orphans.go). Each used to
// list the consumed topics' end offsets and the group's committed offsets
// on its own, at the same samples: twice the ListOffsets and OffsetFetch
// requests for one answer.

// listing is what one listing of the group's offsets says.
type listing struct {
	// lag is the records not fetched yet for the assigned partitions (a
	// share group: the group's); lagKnown is false when it is unknown.
	lag      int64
	lagKnown bool
	// unowned is the consumed partitions not assigned here;
	// unownedKnown is false when they are unknown (always for a share
	// group: its lag is the group's already).
	unowned      []unownedPart
	unownedKnown bool
}

// list is work.list through the Consumer's client: for a consumer group,
// one ListEndOffsets of the consumed and assigned topics, one FetchOffsets
// of the group, and one ListStartOffsets if a partition has no commit.
func (p *stallWatch) list(ctx context.Context, owned []kpar.PartitionStats) listing {
	gc := p.cl.Load()
	if gc == nil {
		return listing{}
	}
	adm := kadm.NewClient(gc.cl)
	if gc.share {
		n, ok := shareLag(ctx, adm, gc.group)
		return listing{lag: n, lagKnown: ok}
	}
	// The unowned partitions are the consumed topics', the lag's the
	// assigned ones': the same topics, unless one was just deleted.
	topics := gc.cl.GetConsumeTopics()
	consumed := make(map[string]bool, len(topics))
	for _, t := range topics {
		consumed[t] = true
	}
	mine := make(map[topicPartition]bool, len(owned))
	for _, s := range owned {
		mine[topicPartition{topic: s.Topic, p: s.Partition}] = true
		if !slices.Contains(topics, s.Topic) {
			topics = append(topics, s.Topic)
		}
	}
	// Nothing to list is known without a listing: no lag when nothing is
	// assigned, no unowned partition when nothing is consumed.
	failed := listing{lagKnown: len(owned) == 0, unownedKnown: len(consumed) == 0}
	if len(topics) == 0 {
		return failed
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return failed
	}
	committed, err := adm.FetchOffsets(ctx, gc.group)
	if err != nil {
		return failed
	}
	var (
		starts       kadm.ListedOffsets
		startsListed bool
	)
	// resume is where the group resumes on a partition: its committed
	// offset, or the log's start where none is committed (the group
	// starts at the oldest record), the start offsets listed once for
	// both. commit is the committed offset and metadata, "" for none.
	resume := func(topic string, partition int32) (from int64, commit string, ok bool) {
		if c, ok := committed.Lookup(topic, partition); ok && c.Err == nil && c.At >= 0 {
			return c.At, fmt.Sprintf("%d %s", c.At, c.Metadata), true
		}
		if !startsListed {
			startsListed = true
			starts, _ = adm.ListStartOffsets(ctx, topics...) // nil on error: unknown below
		}
		start, ok := starts.Lookup(topic, partition)
		if !ok || start.Err != nil {
			return 0, "", false
		}
		return start.Offset, "", true
	}

	l := listing{lagKnown: true, unownedKnown: true}
	for _, s := range owned {
		end, ok := ends.Lookup(s.Topic, s.Partition)
		if !ok || end.Err != nil {
			l.lag, l.lagKnown = 0, false
			break
		}
		from, _, ok := resume(s.Topic, s.Partition)
		if !ok {
			l.lag, l.lagKnown = 0, false
			break
		}
		l.lag += max(end.Offset-from, 0)
	}
	ends.Each(func(end kadm.ListedOffset) {
		if !l.unownedKnown || !consumed[end.Topic] || mine[topicPartition{topic: end.Topic, p: end.Partition}] {
			return
		}
		if end.Err != nil {
			l.unowned, l.unownedKnown = nil, false
			return
		}
		from, commit, ok := resume(end.Topic, end.Partition)
		if !ok {
			l.unowned, l.unownedKnown = nil, false
			return
		}
		l.unowned = append(l.unowned, unownedPart{topic: end.Topic, partition: end.Partition, lag: max(end.Offset-from, 0), committed: commit})
	})
	return l
}

// shareLag is a share group's lag: the group's share-partition lag.
func shareLag(ctx context.Context, adm *kadm.Client, group string) (int64, bool) {
	described, err := adm.DescribeShareGroupOffsets(ctx, group)
	if err != nil {
		return 0, false
	}
	var n int64
	for _, d := range described {
		for _, ps := range d.Offsets {
			for _, o := range ps {
				n += max(o.Lag, 0) // -1: not known
			}
		}
	}
	return n, true
}
