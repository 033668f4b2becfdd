package kafkatest

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func TestSeeds(t *testing.T) {
	t.Setenv(Env, "")
	if s := Seeds(); s != nil {
		t.Fatalf("Seeds() = %v with %s unset, want nil", s, Env)
	}
	t.Setenv(Env, " a:1,b:2 ")
	if s := Seeds(); !slices.Equal(s, []string{"a:1", "b:2"}) {
		t.Fatalf("Seeds() = %v, want [a:1 b:2]", s)
	}
}

// TestPrefixCleansUp: a prefix is a valid topic name unique per call, and
// the topics bearing it are gone when the test that took it ends.
func TestPrefixCleansUp(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seeds := c.ListenAddrs()
	var prefix string
	t.Run("a test/with odd name", func(t *testing.T) {
		prefix = Prefix(t, seeds)
		if other := Prefix(t, seeds); other == prefix {
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
