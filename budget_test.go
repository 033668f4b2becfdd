package kpar

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestCommitBudgetSharedByMembers: a member's least spacing between
// commits is its partitions' share of the group's CommitBudget, and
// follows its assignment. Alone on 8 partitions with a budget of 4 commits
// a second, a member spaces its commits by 250ms; once a second member
// holds half of them, each spaces them by 500ms: the group still sends 4.
func TestCommitBudgetSharedByMembers(t *testing.T) {
	const topic = "budget"
	c := newCluster(t, topic, 8)
	h := HandlerFunc(func(context.Context, *kgo.Record) error { return nil })
	member := func(hooks ...Hook) (*Consumer, <-chan struct{}) {
		commits, signal := commitSignal()
		cons, err := New(h, append(testOpts(c, "g", topic), CommitBudget(4), WithHooks(append(hooks, commits)...))...)
		if err != nil {
			t.Fatal(err)
		}
		return cons, signal
	}
	spacing := func(cons *Consumer) time.Duration {
		cons.mu.Lock()
		defer cons.mu.Unlock()
		if cons.eng == nil {
			return 0
		}
		return cons.eng.src.settleEvery()
	}
	// awaitSpacing waits, commit by commit, for cons's spacing to be want.
	awaitSpacing := func(cons *Consumer, commits <-chan struct{}, want time.Duration, what string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for spacing(cons) != want {
			select {
			case <-commits:
			case <-deadline:
				t.Fatalf("%s: spacing %v, want %v", what, spacing(cons), want)
			}
		}
	}

	a, aCommits := member()
	stopA := runConsumer(t, a)
	produceRange(t, c, c.name(topic), 0, 400, 40)
	awaitSpacing(a, aCommits, 250*time.Millisecond, "alone on 8 partitions")

	assigned := make(chan struct{})
	var once sync.Once
	b, bCommits := member(partitionsHook(func(parts map[string][]int32) {
		if len(parts) > 0 {
			once.Do(func() { close(assigned) })
		}
	}))
	stopB := runConsumer(t, b)
	waitFor(t, assigned, 30*time.Second, "the second member's partitions")
	produceRange(t, c, c.name(topic), 400, 800, 40)
	awaitSpacing(a, aCommits, 500*time.Millisecond, "first member, 4 of 8 partitions")
	awaitSpacing(b, bCommits, 500*time.Millisecond, "second member, 4 of 8 partitions")
	for _, stop := range []func() error{stopB, stopA} {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
}

type partitionsHook func(map[string][]int32)

func (f partitionsHook) OnPartitionsAssigned(parts map[string][]int32) { f(parts) }
