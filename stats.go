package kpar

import (
	"slices"
	"strings"
)

// stats snapshots every partition for Consumer.Partitions.
func (e *engine) stats() []PartitionStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	// A record run in flight holds the records its worker has not
	// started yet too.
	queued := map[*partState]int{}
	for _, r := range e.running {
		if r.t != nil && r.t.Value.run != nil {
			queued[r.t.Value.part] += r.t.Value.run.left()
		}
	}
	out := make([]PartitionStats, 0, len(e.parts))
	for _, ps := range e.parts {
		start, ok := ps.win.Start()
		if !ok {
			start = -1
		}
		out = append(out, PartitionStats{
			Topic:     ps.topic,
			Partition: ps.partition,
			Start:     start,
			End:       ps.win.End(),
			Committed: ps.committed,
			Buffered:  ps.win.Len(),
			Held:      ps.held.Len() + ps.over.Len(),
			Finished:  ps.win.FinishedAbove(),
			InFlight:  ps.running + queued[ps],
			Paused:    ps.buf.Paused(),

			CommittedFinished: ps.committedMeta,
			MetadataCut:       ps.metaCut,
			Skipped:           ps.skipped,
		})
	}
	slices.SortFunc(out, func(a, b PartitionStats) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition - b.Partition)
	})
	return out
}
