package kpar

import (
	"maps"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// topicIDCache holds the topic IDs that transactional commits name topics
// by (txn.go's topicIDs). mu guards ids and gen for map operations only:
// the metadata request that fills a miss runs without it, so the poller,
// which forgets a deleted topic's ID (forgetTopic), never waits behind the
// settler's request.
type topicIDCache struct {
	mu  sync.Mutex
	ids map[string][16]byte
	// gen counts forgets: an answer to a request that began before one is
	// used by that request's commit but not cached, since it may carry the
	// ID of the topic just deleted.
	gen uint64
}

// lookup returns the cached IDs of the topics of a commit's offsets, in a
// fresh map the caller owns, the topics not cached, and the generation to
// store an answer under.
func (c *topicIDCache) lookup(offsets map[string]map[int32]kgo.EpochOffset) (known map[string][16]byte, missing []string, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	known = make(map[string][16]byte)
	for t := range offsets {
		if id, ok := c.ids[t]; ok {
			known[t] = id
		} else {
			missing = append(missing, t)
		}
	}
	return known, missing, c.gen
}

// store caches ids, unless a topic was forgotten since lookup returned gen.
func (c *topicIDCache) store(ids map[string][16]byte, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if c.ids == nil {
		c.ids = make(map[string][16]byte, len(ids))
	}
	maps.Copy(c.ids, ids)
}

// forget drops a topic's ID: the topic was deleted, and one recreated
// under its name has another.
func (c *topicIDCache) forget(topic string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.ids, topic)
	c.gen++
}
