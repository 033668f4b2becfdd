package kpar

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar/internal/testkit"
)

// TestAForgottenMemberHeartbeatsAtItsFirstRefusedCommit: a
// consumer-protocol member the broker forgot (as a broker restarted after a
// kill -9 does) learns it from its first refused commit, not from its next
// heartbeat: it heartbeats at once, loses its partitions, gets them back
// with what it finished, and its commits land again. Here the heartbeat
// interval is 5 minutes, so only the commit can tell it within the test's
// bounds; after a broker restart it was kgo's heartbeat backoff, 2-3.5s of
// records finished that could not be committed (issue 35).
func TestAForgottenMemberHeartbeatsAtItsFirstRefusedCommit(t *testing.T) {
	const topic, group, keys = "forgotten", "forgotten", 10
	if testkit.RealSeeds() != nil {
		t.Skipf("kfake only (makes the broker forget a member); runs without %s", testkit.BrokersEnv)
	}
	c := testkit.Cluster(t, kfake.SeedTopics(1, topic), kfake.BrokerConfigs(map[string]string{
		"group.consumer.session.timeout.ms":    "600000",
		"group.consumer.heartbeat.interval.ms": "300000",
	}))
	l, cons, rebalances, commits, stop := runSignalledMember(t, c, group, topic)
	produceRange(t, c, topic, 0, 100, keys, l.Produced)
	waitFor(t, l.Reached(100), 30*time.Second, "the first 100 records handled")
	waitPartition(t, cons, commits, "the first 100 records committed", func(s PartitionStats) bool { return s.Committed == 100 })
	await(t, rebalances.assigned, "the first assignment")

	forget(t, c, group)
	produceRange(t, c, topic, 100, 200, keys, l.Produced)
	waitFor(t, l.Reached(200), 30*time.Second, "records up to 200 handled")
	await(t, rebalances.lost, "partitions lost after a commit was refused (UNKNOWN_MEMBER_ID), well before the next heartbeat")
	await(t, rebalances.assigned, "partitions assigned again")
	waitPartition(t, cons, commits, "all 200 committed by the rejoined member", func(s PartitionStats) bool { return s.Committed == 200 })

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rep := l.Report(); rep.Duplicates != 0 || rep.Lost != 0 || rep.Handled != 200 {
		t.Fatalf("%+v, want 200 records handled once each", rep)
	}
}

// forget makes the broker forget the only member of a consumer-protocol
// group, as a broker restarted after a kill -9 does: it leaves on the
// member's behalf.
func forget(t *testing.T, c *kfake.Cluster, group string) {
	t.Helper()
	info := c.GroupInfo(group)
	if info == nil || len(info.Members) != 1 {
		t.Fatalf("group %s: %+v, want one member", group, info)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group, req.MemberID, req.MemberEpoch = group, info.Members[0].MemberID, -1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && resp.ErrorCode != 0 {
		err = fmt.Errorf("error code %d", resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("leaving on behalf of member %s: %v", info.Members[0].MemberID, err)
	}
}
