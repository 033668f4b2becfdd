package testkit

// The real-cluster side of the suites. By default they run against
// franz-go's kfake, in process or as `kpar broker`; when KPAR_TEST_BROKERS
// names the seed brokers of a real cluster ("host:port,..."), the suites
// that support it run there instead, as franz-go's own tests do with
// KGO_SEEDS. On a real cluster every topic and group of a test gets a
// prefix unique to the test and the run, so runs and tests never share
// state, and is deleted when the test ends.

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
	"github.com/twmb/franz-go/pkg/kgo"
)

// BrokersEnv is the variable naming a real cluster's seed brokers.
const BrokersEnv = "KPAR_TEST_BROKERS"

// RealSessionTimeout is the least session timeout a real cluster allows by
// default (group.min.session.timeout.ms); kfake's tests go lower.
const RealSessionTimeout = 6 * time.Second

// RealSeeds returns the seed brokers of KPAR_TEST_BROKERS, nil when it is
// unset: the tests then use kfake.
func RealSeeds() []string {
	v := strings.TrimSpace(os.Getenv(BrokersEnv))
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

var notInName = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// RealPrefix returns a prefix for t's topic and group names on the cluster
// seeds, unique to t and this run, and deletes every topic and group
// bearing it when t ends.
func RealPrefix(t testing.TB, seeds []string) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := notInName.ReplaceAllString(t.Name(), ".")
	if len(name) > 100 {
		name = name[len(name)-100:]
	}
	prefix := "kpar-test-" + name + "-" + hex.EncodeToString(b) + "-"
	t.Cleanup(func() { deleteAll(t, seeds, prefix) })
	return prefix
}

// CreateTopic creates topic with partitions partitions and the broker's
// default replication factor.
func CreateTopic(t testing.TB, seeds []string, topic string, partitions int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := admin(t, seeds)
	defer adm.Close()
	resp, err := adm.CreateTopic(ctx, partitions, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
}

func admin(t testing.TB, seeds []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	return kadm.NewClient(cl)
}

// deleteAll deletes the groups and topics whose names start with prefix.
func deleteAll(t testing.TB, seeds []string, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := admin(t, seeds)
	defer adm.Close()
	if groups, err := adm.ListGroups(ctx); err == nil {
		var mine []string
		for _, g := range groups.Groups() {
			if strings.HasPrefix(g, prefix) {
				mine = append(mine, g)
			}
		}
		if len(mine) > 0 {
			if _, err := adm.DeleteGroups(ctx, mine...); err != nil {
				t.Logf("deleting the test's groups %v: %v", mine, err)
			}
		}
	}
	if topics, err := adm.ListTopics(ctx); err == nil {
		var mine []string
		for _, td := range topics.Sorted() {
			if strings.HasPrefix(td.Topic, prefix) {
				mine = append(mine, td.Topic)
			}
		}
		if len(mine) > 0 {
			if _, err := adm.DeleteTopics(ctx, mine...); err != nil {
				t.Logf("deleting the test's topics %v: %v", mine, err)
			}
		}
	}
}
