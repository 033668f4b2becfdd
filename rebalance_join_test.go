package kpar

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"
)

// TestShutdownWhileJoiningIsQuick: a member whose JoinGroup waits for
// another member of the group (here one that joined and went silent)
// returns from Run within a couple of seconds of its cancel, not after its
// whole ShutdownTimeout: it holds nothing to drain or commit.
func TestShutdownWhileJoiningIsQuick(t *testing.T) {
	// Run's client finishes closing in the background once its join ends
	// (Run says so): here within the zombie's rebalance timeout. Checked
	// last, once the cluster closed too.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		for deadline := time.Now().Add(15 * time.Second); ; {
			err := goleak.Find(before) // retries for a second or two itself
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("the client did not finish closing once its join could end: %v", err)
				return
			}
		}
	})
	c := newCluster(t, "j", 2)
	produce(t, c, "j", 10, 2)
	// A zombie member joins with a 20s session and rebalance timeout and never comes back.
	zc, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer zc.Close()
	join := func(member string) *kmsg.JoinGroupResponse {
		req := kmsg.NewPtrJoinGroupRequest()
		req.Group, req.MemberID, req.ProtocolType = c.name("g"), member, "consumer"
		req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = 20000, 3000
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name = "kpar-key-cooperative-sticky"
		req.Protocols = append(req.Protocols, p)
		resp, err := req.RequestWith(context.Background(), zc)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	r := join("")
	r = join(r.MemberID)
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.MemberID, sync.Generation, sync.ProtocolType = c.name("g"), r.MemberID, r.Generation, kmsg.StringPtr("consumer")
	sync.Protocol = kmsg.StringPtr("kpar-key-cooperative-sticky")
	sa := kmsg.NewSyncGroupRequestGroupAssignment()
	sa.MemberID = r.MemberID
	sync.GroupAssignment = append(sync.GroupAssignment, sa)
	if _, err := sync.RequestWith(context.Background(), zc); err != nil {
		t.Fatal(err)
	}
	cons, err := New(HandlerFunc(func(context.Context, *kgo.Record) error { return nil }), append(testOpts(c, "g", "j"), ShutdownTimeout(10*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- cons.Run(ctx) }()
	time.Sleep(500 * time.Millisecond) // the member is joining: its JoinGroup waits on the zombie
	start := time.Now()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Run returned %v after the cancel; want about 2s for a member still joining, not its ShutdownTimeout (10s)", took)
	}
}
