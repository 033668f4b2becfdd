package testkit

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func TestRealSeeds(t *testing.T) {
	t.Setenv(BrokersEnv, "")
	if s := RealSeeds(); s != nil {
		t.Fatalf("RealSeeds() = %v with %s unset, want nil", s, BrokersEnv)
	}
	t.Setenv(BrokersEnv, " a:1,b:2 ")
	if s := RealSeeds(); !slices.Equal(s, []string{"a:1", "b:2"}) {
		t.Fatalf("RealSeeds() = %v, want [a:1 b:2]", s)
	}
}

// TestRealPrefixCleansUp: a prefix is a valid topic name unique per call, and
// the topics bearing it are gone when the test that took it ends.
func TestRealPrefixCleansUp(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seeds := c.ListenAddrs()
	var prefix string
	t.Run("a test/with odd name", func(t *testing.T) {
		prefix = RealPrefix(t, seeds)
		if other := RealPrefix(t, seeds); other == prefix {
			t.Fatalf("two calls gave the same prefix %q", prefix)
		}
		if !regexp.MustCompile(`^[a-zA-Z0-9._-]+$`).MatchString(prefix) {
			t.Fatalf("prefix %q is not a valid topic name", prefix)
		}
		CreateTopic(t, seeds, prefix+"orders", 3)
	})
	adm := admin(t, seeds)
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, td := range topics.Sorted() {
		if strings.HasPrefix(td.Topic, prefix) {
			t.Fatalf("topic %s outlived its test", td.Topic)
		}
	}
}
