package kpar

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// commitSeen closes a channel after the first successful commit.
type commitSeen struct {
	once sync.Once
	ch   chan struct{}
}

func (c *commitSeen) OnCommit(_ map[string]map[int32]int64, err error) {
	if err == nil {
		c.once.Do(func() { close(c.ch) })
	}
}

// TestOrderingIsCheckedInBothProtocols: in either group protocol, a member
// of another ordering mode than the one the group's commits name is
// refused before it handles a record, with ErrOrderingMismatch naming both
// modes; once every member stopped, a member of a new mode changes the
// group's mode, and a member of the old one is then the one refused.
func TestOrderingIsCheckedInBothProtocols(t *testing.T) {
	for _, p := range []Protocol{ClassicProtocol, ConsumerProtocol} {
		t.Run(p.String(), func(t *testing.T) {
			c := newFakeCluster(t, notPorted, "mixed", 2)
			produce(t, c, "mixed", 10, 10)
			nothing := HandlerFunc(func(context.Context, *kgo.Record) error { return nil })
			member := func(o Order, hooks ...Hook) *Consumer {
				t.Helper()
				opts := append(testOpts(c, "mixed", "mixed"), Ordering(o), GroupProtocol(p))
				if len(hooks) > 0 {
					opts = append(opts, WithHooks(hooks...))
				}
				cons, err := New(nothing, opts...)
				if err != nil {
					t.Fatal(err)
				}
				return cons
			}
			// The classic protocol refuses a member of another mode at its
			// join already (orderedBalancer); the group's mode is then read
			// from the protocol it runs.
			refused := func(o Order, want ...string) {
				t.Helper()
				var handled bool
				cons, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { handled = true; return nil }),
					append(testOpts(c, "mixed", "mixed"), Ordering(o), GroupProtocol(p))...)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				err = cons.Run(ctx)
				if !errors.Is(err, ErrOrderingMismatch) {
					t.Fatalf("a %s member's Run returned %v, want ErrOrderingMismatch", o, err)
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("the error %q does not name %q", err, w)
					}
				}
				if handled {
					t.Errorf("the refused %s member handled a record", o)
				}
			}
			runUntilCommit := func(o Order) (stop func() error) {
				t.Helper()
				seen := &commitSeen{ch: make(chan struct{})}
				cons := member(o, seen)
				stop = runConsumer(t, cons)
				waitFor(t, seen.ch, 20*time.Second, "the member's first commit")
				return stop
			}

			stop := runUntilCommit(ByKey)
			refused(Unordered, "ordering by key", "this member orders by unordered")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			// Every member stopped: the group changes mode with its next.
			produceRange(t, c, nameIn(c, "mixed"), 10, 20, 10)
			stop = runUntilCommit(Unordered)
			refused(ByKey, "ordering by unordered", "this member orders by key")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMixedGroupProtocolsAreRefusedClearly: a member that joins a group
// whose members run the other group protocol, on a broker that does not
// migrate groups between them (kfake), ends with an error that says so,
// instead of retrying its join forever; the group goes on without it.
func TestMixedGroupProtocolsAreRefusedClearly(t *testing.T) {
	for _, first := range []Protocol{ClassicProtocol, ConsumerProtocol} {
		second := ConsumerProtocol
		if first == ConsumerProtocol {
			second = ClassicProtocol
		}
		t.Run(first.String()+" then "+second.String(), func(t *testing.T) {
			t.Parallel()
			c := newFakeCluster(t, notPorted, "mixproto", 2)
			produce(t, c, "mixproto", 20, 5)
			seen := &commitSeen{ch: make(chan struct{})}
			cons, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
				append(testOpts(c, "mixproto", "mixproto"), GroupProtocol(first), WithHooks(seen))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			waitFor(t, seen.ch, 20*time.Second, "the first member's commit")
			joiner, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
				append(testOpts(c, "mixproto", "mixproto"), GroupProtocol(second))...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			err = joiner.Run(ctx)
			if err == nil || !strings.Contains(err.Error(), "cannot join it with the "+second.String()+" protocol") {
				t.Fatalf("the %s joiner's Run returned %v; want an error saying it cannot join with its protocol", second, err)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
