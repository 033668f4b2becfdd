package kpar

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/testkit"
)

// TestRecreatedTopicIsConsumedAgain deletes the consumed topic while the
// consumer (the engine, and RunMembers) runs and creates it again: the
// records of the new topic must be handled, not lost behind fetch errors
// for the old topic's ID, and the hooks hear of the gap.
func TestRecreatedTopicIsConsumedAgain(t *testing.T) {
	t.Run("engine", func(t *testing.T) { t.Parallel(); testRecreatedTopic(t, false) })
	t.Run("members", func(t *testing.T) { t.Parallel(); testRecreatedTopic(t, true) })
}

func testRecreatedTopic(t *testing.T, members bool) {
	const topic = "recreated"
	c := newFakeCluster(t, notPorted, topic, 2)
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	before, after := make(chan struct{}), make(chan struct{})
	var beforeOnce, afterOnce sync.Once
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		seen[string(r.Value)] = true
		nb, na := 0, 0
		for v := range seen {
			if strings.HasPrefix(v, "before") {
				nb++
			} else {
				na++
			}
		}
		if nb == 20 {
			beforeOnce.Do(func() { close(before) })
		}
		if na == 20 {
			afterOnce.Do(func() { close(after) })
		}
		return nil
	})
	// The records before are committed before the topic goes: a commit of
	// the old topic's offsets that lands after it was created again would
	// apply them to the new one (commits name the topic, not its ID), a
	// race of the test's making, not what it tests.
	committedBefore := make(chan struct{})
	var committedOnce sync.Once
	var commitMu sync.Mutex
	committed := map[int32]int64{}
	commits := commitHook(func(offsets map[string]map[int32]int64, err error) {
		commitMu.Lock()
		defer commitMu.Unlock()
		if err != nil {
			return
		}
		sum := int64(0)
		for p, o := range offsets[topic] {
			committed[p] = max(committed[p], o)
		}
		for _, o := range committed {
			sum += o
		}
		if sum >= 20 {
			committedOnce.Do(func() { close(committedBefore) })
		}
	})
	var unavailable topicEvents
	var stop func() error
	if members {
		stop = runMembers(t, 2, h, append(groupOpts(c, "g", topic), WithHooks(&unavailable, commits))...)
	} else {
		cons, err := New(h, append(testOpts(c, "g", topic), WithHooks(&unavailable, commits))...)
		if err != nil {
			t.Fatal(err)
		}
		stop = runConsumer(t, cons)
	}

	produceValues(t, c, topic, "before", 20)
	waitFor(t, before, 20*time.Second, "the records produced before the topic was recreated")
	waitFor(t, committedBefore, 20*time.Second, "the commit of the records produced before the topic was recreated")

	adm := adminClient(t, c)
	ctx := context.Background()
	if _, err := adm.DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	createTopic(t, c, topic, 2)
	produceValues(t, c, topic, "after", 20)
	waitFor(t, after, 30*time.Second, "the records produced after the topic was recreated")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Readiness checks (kparprom's /readyz) learn of the gap from the hook.
	// (Each member of RunMembers watches for itself.)
	if got := unavailable.list(); len(got) < 2 || got[0] != topic+": unavailable" || got[len(got)-1] != topic+": available" {
		t.Fatalf("HookTopicUnavailable calls = %q, want the topic unavailable, then available", got)
	}
}

type topicEvents struct {
	mu     sync.Mutex
	events []string
}

func (e *topicEvents) OnTopicUnavailable(topic string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	state := "available"
	if err != nil {
		state = "unavailable"
	}
	e.events = append(e.events, topic+": "+state)
}

func (e *topicEvents) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.events...)
}

func produceValues(t *testing.T, c interface{ ListenAddrs() []string }, topic, prefix string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range n {
		r := &kgo.Record{Topic: topic, Value: []byte(prefix + "-" + string(rune('a'+i)))}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// groupOpts are testOpts' counterparts for RunMembers.
func groupOpts(c *kfake.Cluster, group, topic string) []MemberOpt {
	logger := testLogger()
	return []MemberOpt{
		WithLogger(logger),
		Brokers(c.ListenAddrs()...),
		Group(group),
		Topics(topic),
		RetryBackoff(time.Millisecond, 10*time.Millisecond),
		ClientOptions(
			kgo.HeartbeatInterval(100*time.Millisecond),
			kgo.SessionTimeout(2*time.Second),
			kgo.FetchMaxWait(100*time.Millisecond),
		),
	}
}

// runMembers runs RunMembers in the background; stop cancels it and
// returns its error.
func runMembers(t *testing.T, n int, h Handler, opts ...MemberOpt) (stop func() error) {
	return testkit.Start(t, "RunMembers", func(ctx context.Context) error { return RunMembers(ctx, n, h, opts...) })
}
