package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/kpar/kpar/internal/testkit"
)

// The chaos tests run `kpar forward` against a `kpar broker` process, or
// against the real cluster KPAR_TEST_BROKERS names (internal/testkit),
// where each test's topics and groups get a unique prefix and are deleted
// at its end. Tests that kill the broker itself skip there.

// chaosCluster is where a chaos test runs: addr is the seed list for
// --brokers and newClient, name maps the test's topic and group names.
type chaosCluster struct {
	addr   string
	prefix string
}

func (c chaosCluster) name(s string) string { return c.prefix + s }

// newChaosCluster starts `kpar broker` (the built binary) with topics of
// partitions partitions, or uses the KPAR_TEST_BROKERS cluster, creating
// topics there with that many partitions.
func newChaosCluster(ctx context.Context, t *testing.T, bin string, partitions int, topics ...string) chaosCluster {
	t.Helper()
	seeds := testkit.RealSeeds()
	if seeds == nil {
		_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", strconv.Itoa(partitions))
		return chaosCluster{addr: addr}
	}
	c := chaosCluster{addr: strings.Join(seeds, ","), prefix: testkit.RealPrefix(t, seeds)}
	for _, topic := range topics {
		testkit.CreateTopic(t, seeds, c.name(topic), int32(partitions))
	}
	return c
}

// skipOnRealCluster skips a test that needs the `kpar broker` process.
func skipOnRealCluster(t *testing.T, why string) {
	t.Helper()
	if testkit.RealSeeds() != nil {
		t.Skipf("needs the kpar broker process (%s); runs without %s", why, testkit.BrokersEnv)
	}
}
