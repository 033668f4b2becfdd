package main

import (
	"sync"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/internal/ledger"
)

// commitTracker keeps the last offsets kpar committed for the demo topic,
// which outlive the consumer's run, unlike PartitionStats, and hands each
// commit to the run's ledger, which checks that no commit passed an
// unfinished record.
type commitTracker struct {
	topic   string
	ledger  *ledger.Ledger
	mu      sync.Mutex      // guards offsets
	offsets map[int32]int64 // partition -> next offset to consume
}

var _ kpar.HookCommit = (*commitTracker)(nil)

func (c *commitTracker) OnCommit(offsets map[string]map[int32]int64, err error) {
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, o := range offsets[c.topic] {
		c.offsets[p] = o
		c.ledger.Committed(c.topic, p, o)
	}
}

// offset returns the offset last committed for a partition.
func (c *commitTracker) offset(partition int32) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.offsets[partition]
	return o, ok
}

// total returns the committed offsets summed over partitions: the records
// below the commit point, as the demo topic's partitions start at 0.
func (c *commitTracker) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, o := range c.offsets {
		n += o
	}
	return n
}
