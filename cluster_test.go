package kpar

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kpar/kpar/internal/testkit"
)

// The tests run against an in-process kfake broker, or against the real
// cluster KPAR_TEST_BROKERS names (internal/testkit): there each test's
// topics and groups get a unique prefix and are deleted at its end. Tests
// that need kfake itself (fault injection, controls) take newFakeCluster
// and skip there.

// cluster is what the test helpers need of a cluster: *kfake.Cluster or
// *testCluster.
type cluster interface {
	ListenAddrs() []string
}

// testCluster is one test's cluster: kfake in-process, or a real one.
type testCluster struct {
	fake   *kfake.Cluster // nil on a real cluster
	addrs  []string
	prefix string // of every topic and group name on a real cluster; "" on kfake
}

func (c *testCluster) ListenAddrs() []string { return c.addrs }

// name is the real name of a test's topic or group.
func (c *testCluster) name(s string) string { return c.prefix + s }

// nameIn is name for any cluster: kfake names are the test's own.
func nameIn(c cluster, s string) string {
	if tc, ok := c.(*testCluster); ok {
		return tc.name(s)
	}
	return s
}

// onRealCluster reports whether c is a real cluster.
func onRealCluster(c cluster) bool {
	tc, ok := c.(*testCluster)
	return ok && tc.fake == nil
}

// newCluster returns the test's cluster with topic (partitions
// partitions): a kfake broker with short group timeouts, so rebalances
// take well under a second, or the KPAR_TEST_BROKERS cluster.
func newCluster(t testing.TB, topic string, partitions int32) *testCluster {
	t.Helper()
	seeds := testkit.RealSeeds()
	if seeds == nil {
		fake := startFake(t, topic, partitions)
		return &testCluster{fake: fake, addrs: fake.ListenAddrs()}
	}
	c := &testCluster{addrs: seeds, prefix: testkit.RealPrefix(t, seeds)}
	testkit.CreateTopic(t, seeds, c.name(topic), partitions)
	return c
}

// notPorted is why a test that needs nothing of kfake's still runs on kfake
// only: it compares topic or group names without the real cluster's
// prefix, or counts on kfake's timing.
const notPorted = "not yet ported to a real cluster"

// newFakeCluster is newCluster for tests that need kfake itself (faults,
// controls): they skip on a real cluster, saying why.
func newFakeCluster(t testing.TB, why, topic string, partitions int32) *kfake.Cluster {
	t.Helper()
	if testkit.RealSeeds() != nil {
		t.Skipf("kfake only (%s); runs without %s", why, testkit.BrokersEnv)
	}
	return startFake(t, topic, partitions)
}

func startFake(t testing.TB, topic string, partitions int32) *kfake.Cluster {
	t.Helper()
	return testkit.Cluster(t,
		kfake.SeedTopics(partitions, topic),
		kfake.AllowAutoTopicCreation(),
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
		// The consumer protocol's session timeout is the broker's: as
		// short as the classic members' of testOpts.
		kfake.BrokerConfigs(map[string]string{
			"group.consumer.session.timeout.ms":    "2000",
			"group.consumer.heartbeat.interval.ms": "100",
		}),
	)
}
