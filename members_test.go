package kpar_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kpar/kpar"
)

// TestRunMembersHandlesEverythingInPartitionOrder runs three members over
// six partitions while they join (and rebalance) concurrently, with some
// attempts failing or panicking: every record is handled, each partition's
// records are first handled in offset order, and the committed offsets end
// at the high watermarks.
func TestRunMembersHandlesEverythingInPartitionOrder(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const (
		partitions = 6
		records    = 3000
	)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	produce(t, cluster.ListenAddrs(), "orders", records)

	var (
		mu       sync.Mutex
		attempts = map[[2]int64]int{}  // (partition, offset) -> attempts
		order    = map[int32][]int64{} // successful handlings in time order
		handled  = map[[2]int64]bool{}
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := kpar.HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		k := [2]int64{int64(r.Partition), r.Offset}
		mu.Lock()
		attempts[k]++
		first := attempts[k] == 1
		mu.Unlock()
		switch {
		case first && r.Offset%37 == 5:
			return errors.New("transient")
		case first && r.Offset%101 == 7:
			panic("boom")
		}
		time.Sleep(200 * time.Microsecond) // slow enough that the members rebalance mid-run
		mu.Lock()
		defer mu.Unlock()
		order[r.Partition] = append(order[r.Partition], r.Offset)
		handled[k] = true
		if len(handled) == records {
			cancel()
		}
		return nil
	})
	assigns, requests := &assignCounter{}, &commitRequestCounter{}
	err = kpar.RunMembers(ctx, 3, h,
		kpar.WithHooks(assigns, requests),
		kpar.Brokers(cluster.ListenAddrs()...),
		kpar.Group("members"),
		kpar.Topics("orders"),
		kpar.RetryBackoff(time.Millisecond, 5*time.Millisecond),
		kpar.ClientOptions(kgo.HeartbeatInterval(100*time.Millisecond)),
	)
	if err != nil {
		t.Fatalf("RunMembers: %v", err)
	}
	if n := assigns.count(); n < 2 {
		t.Errorf("%d assignments seen, want one per member that got partitions (at least 2)", n)
	}
	// Every commit is one request of at least one partition; each offset
	// alone takes more than 16 bytes on the wire.
	if r := requests.get(); r.requests == 0 || r.partitions < r.requests || r.bytes < 16*r.partitions {
		t.Errorf("commit requests reported: %+v; want some, each with a partition and its bytes", r)
	}
	if len(handled) != records {
		t.Fatalf("handled %d of %d records before the deadline", len(handled), records)
	}
	for p, offs := range order {
		seen := map[int64]bool{}
		last := int64(-1)
		for _, o := range offs {
			if seen[o] {
				continue // a re-delivery after a rebalance
			}
			seen[o] = true
			if o < last {
				t.Fatalf("partition %d: offset %d first handled after offset %d", p, o, last)
			}
			last = o
		}
	}

	adm, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	committed, err := kadm.NewClient(adm).FetchOffsets(context.Background(), "members")
	if err != nil {
		t.Fatal(err)
	}
	ends, err := kadm.NewClient(adm).ListEndOffsets(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		c, ok := committed.Lookup(e.Topic, e.Partition)
		if !ok || c.At != e.Offset {
			t.Errorf("partition %d: committed %v, want the end offset %d", e.Partition, c.At, e.Offset)
		}
	})
}

func TestRunMembersRejectsBadArguments(t *testing.T) {
	h := kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return nil })
	for _, tc := range []struct {
		name string
		n    int
		h    kpar.Handler
		opts []kpar.MemberOpt
		want string
	}{
		{"zero members", 0, h, []kpar.MemberOpt{kpar.Brokers("127.0.0.1:1"), kpar.Group("g"), kpar.Topics("t")}, "RunMembers(n=0)"},
		{"nil handler", 1, nil, []kpar.MemberOpt{kpar.Brokers("127.0.0.1:1"), kpar.Group("g"), kpar.Topics("t")}, "nil handler"},
		{"no group", 1, h, []kpar.MemberOpt{kpar.Brokers("127.0.0.1:1"), kpar.Topics("t")}, "no group"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := kpar.RunMembers(context.Background(), tc.n, tc.h, tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func produce(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	p, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var rs []*kgo.Record
	for i := range n {
		rs = append(rs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%50), Value: fmt.Appendf(nil, "v%d", i)})
	}
	if err := p.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// assignCounter counts OnPartitionsAssigned calls with partitions.
type assignCounter struct {
	mu sync.Mutex
	n  int
}

func (a *assignCounter) OnPartitionsAssigned(m map[string][]int32) {
	if len(m) > 0 {
		a.mu.Lock()
		a.n++
		a.mu.Unlock()
	}
}

// commitRequestCounter sums what HookCommitRequest reports.
type commitRequestCounter struct {
	mu sync.Mutex
	r  struct{ requests, partitions, bytes int }
}

func (c *commitRequestCounter) OnCommitRequest(partitions, bytes int, _ error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.r.requests++
	c.r.partitions += partitions
	c.r.bytes += bytes
}

func (c *commitRequestCounter) get() struct{ requests, partitions, bytes int } {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r
}

func (a *assignCounter) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}
