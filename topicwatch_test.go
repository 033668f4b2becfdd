package kpar

import (
	"slices"
	"testing"
)

// TestGoneNewsWakesAndTellsEachTopicOnce checks what RunMembers' members
// share about gone topics: an announcement ends the wait of every member
// that has not acted on it yet, and each member hears a topic once however
// often it was announced since the member last looked.
func TestGoneNewsWakesAndTellsEachTopicOnce(t *testing.T) {
	n := newGoneNews()
	topics, seen, wake := n.since(0)
	if len(topics) != 0 || seen != 0 || wake.Err() != nil {
		t.Fatalf("fresh news: topics %q, seen %d, woken %v", topics, seen, wake.Err())
	}
	n.announce("a")
	n.announce("b")
	n.announce("a")
	if wake.Err() == nil {
		t.Fatal("an announcement did not end the wait")
	}
	topics, seen, wake = n.since(seen)
	slices.Sort(topics)
	if !slices.Equal(topics, []string{"a", "b"}) || seen != 3 || wake.Err() != nil {
		t.Fatalf("after three announcements: topics %q, seen %d, woken %v", topics, seen, wake.Err())
	}
	if topics, _, _ := n.since(seen); len(topics) != 0 {
		t.Fatalf("heard %q again", topics)
	}
	n.announce("b")
	if topics, _, _ := n.since(seen); !slices.Equal(topics, []string{"b"}) {
		t.Fatalf("after one more announcement: topics %q, want [b]", topics)
	}
}
