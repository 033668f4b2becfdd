package kpar

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestTopicIDCacheDropsAnAnswerOlderThanAForget: an ID learned by a request
// that began before its topic was forgotten serves that request's commit
// but is not cached, and what lookup returns is the caller's own map.
func TestTopicIDCacheDropsAnAnswerOlderThanAForget(t *testing.T) {
	var c topicIDCache
	offsets := map[string]map[int32]kgo.EpochOffset{"a": nil, "b": nil}
	known, missing, gen := c.lookup(offsets)
	if len(known) != 0 || len(missing) != 2 {
		t.Fatalf("empty cache: known %v, missing %v", known, missing)
	}
	known["a"], known["b"] = [16]byte{1}, [16]byte{2}
	c.store(known, gen)
	known, missing, gen = c.lookup(offsets)
	if len(missing) != 0 || known["a"] != [16]byte{1} {
		t.Fatalf("after store: known %v, missing %v", known, missing)
	}
	delete(known, "a") // the caller's map: the cache keeps its own
	c.forget("b")
	known, missing, gen = c.lookup(offsets)
	if len(missing) != 1 || missing[0] != "b" || known["a"] != [16]byte{1} {
		t.Fatalf("after forget(b): known %v, missing %v", known, missing)
	}
	c.forget("a") // deleted while the request for b is in flight
	known["b"] = [16]byte{3}
	c.store(known, gen)
	if _, missing, _ := c.lookup(offsets); len(missing) != 2 {
		t.Fatalf("an answer older than a forget was cached: missing %v, want both", missing)
	}
}
