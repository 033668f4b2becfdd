package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// The chaos tests run `kpar forward` against a `kpar broker` process, or,
// when KPAR_TEST_BROKERS names the seed brokers of a real cluster
// ("host:port,..."), against that cluster. There every topic and group of
// a test gets a prefix unique to the run, and is deleted when the test
// ends. Tests that kill the broker itself skip there.

// realBrokers is KPAR_TEST_BROKERS, "" when unset.
func realBrokers() string { return strings.TrimSpace(os.Getenv("KPAR_TEST_BROKERS")) }

// chaosCluster is where a chaos test runs: addr is the seed list for
// --brokers and newClient, name maps the test's topic and group names.
type chaosCluster struct {
	addr   string
	prefix string
}

func (c chaosCluster) name(s string) string { return c.prefix + s }

var notInName = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// newChaosCluster starts `kpar broker` (the built binary) with topics of
// partitions partitions, or uses the KPAR_TEST_BROKERS cluster, creating
// topics there with that many partitions.
func newChaosCluster(ctx context.Context, t *testing.T, bin string, partitions int, topics ...string) chaosCluster {
	t.Helper()
	seeds := realBrokers()
	if seeds == "" {
		_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", strconv.Itoa(partitions))
		return chaosCluster{addr: addr}
	}
	b := make([]byte, 4)
	rand.Read(b)
	c := chaosCluster{addr: seeds, prefix: "kpar-test-" + notInName.ReplaceAllString(t.Name(), ".") + "-" + hex.EncodeToString(b) + "-"}
	adm := kadm.NewClient(newClient(t, seeds))
	t.Cleanup(func() {
		defer adm.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if groups, err := adm.ListGroups(ctx); err == nil {
			var mine []string
			for _, g := range groups.Groups() {
				if strings.HasPrefix(g, c.prefix) {
					mine = append(mine, g)
				}
			}
			adm.DeleteGroups(ctx, mine...)
		}
		if ts, err := adm.ListTopics(ctx); err == nil {
			var mine []string
			for _, td := range ts.Sorted() {
				if strings.HasPrefix(td.Topic, c.prefix) {
					mine = append(mine, td.Topic)
				}
			}
			adm.DeleteTopics(ctx, mine...)
		}
	})
	for _, topic := range topics {
		resp, err := adm.CreateTopic(ctx, int32(partitions), -1, nil, c.name(topic))
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating %s: %v", c.name(topic), err)
		}
	}
	return c
}

// skipOnRealCluster skips a test that needs the `kpar broker` process.
func skipOnRealCluster(t *testing.T, why string) {
	t.Helper()
	if realBrokers() != "" {
		t.Skipf("needs the kpar broker process (%s); runs without KPAR_TEST_BROKERS", why)
	}
}
