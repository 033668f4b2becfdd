package kpar

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The tests run against an in-process kfake broker, or, when
// KPAR_TEST_BROKERS names the seed brokers of a real cluster
// ("host:port,..."), against that cluster, as franz-go's tests do with
// KGO_SEEDS. On a real cluster every topic and group a test uses gets a
// prefix unique to the test run (so runs and tests never share state) and
// is deleted when the test ends. Tests that need kfake itself (fault
// injection, controls) take newFakeCluster and skip there.

// realBrokers is KPAR_TEST_BROKERS split into seeds, nil when unset.
func realBrokers() []string {
	v := strings.TrimSpace(os.Getenv("KPAR_TEST_BROKERS"))
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

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
	seeds := realBrokers()
	if seeds == nil {
		fake := startFake(t, topic, partitions)
		return &testCluster{fake: fake, addrs: fake.ListenAddrs()}
	}
	b := make([]byte, 4)
	rand.Read(b)
	c := &testCluster{addrs: seeds, prefix: "kpar-test-" + testName(t) + "-" + hex.EncodeToString(b) + "-"}
	t.Cleanup(func() { c.cleanUp(t) })
	createTopic(t, c, topic, partitions)
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
	if realBrokers() != nil {
		t.Skipf("kfake only (%s); runs without KPAR_TEST_BROKERS", why)
	}
	return startFake(t, topic, partitions)
}

func startFake(t testing.TB, topic string, partitions int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topic),
		kfake.AllowAutoTopicCreation(),
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

var notInName = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// testName is t's name as a piece of a topic name.
func testName(t testing.TB) string {
	n := notInName.ReplaceAllString(t.Name(), ".")
	if len(n) > 100 {
		n = n[len(n)-100:]
	}
	return n
}

// cleanUp deletes the test's topics and groups from a real cluster.
func (c *testCluster) cleanUp(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.addrs...))
	if err != nil {
		t.Logf("cleaning up %s*: %v", c.prefix, err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if groups, err := adm.ListGroups(ctx); err == nil {
		var mine []string
		for _, g := range groups.Groups() {
			if strings.HasPrefix(g, c.prefix) {
				mine = append(mine, g)
			}
		}
		if len(mine) > 0 {
			if _, err := adm.DeleteGroups(ctx, mine...); err != nil {
				t.Logf("deleting groups %v: %v", mine, err)
			}
		}
	}
	if topics, err := adm.ListTopics(ctx); err == nil {
		var mine []string
		for _, td := range topics.Sorted() {
			if strings.HasPrefix(td.Topic, c.prefix) {
				mine = append(mine, td.Topic)
			}
		}
		if len(mine) > 0 {
			if _, err := adm.DeleteTopics(ctx, mine...); err != nil {
				t.Logf("deleting topics %v: %v", mine, err)
			}
		}
	}
}
