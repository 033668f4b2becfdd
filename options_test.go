package kpar

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// nopSink is a dead-letter sink that is not Kafka's.
type nopSink struct{}

func (nopSink) Write(context.Context, []deadletter.Letter) error { return nil }

// TestNewRefusesEveryPairThatCannotApplyTogether: every pair of options
// that each hold alone but not together is refused by New (or NewBatch),
// with an error that names both, so that no option is silently ignored.
func TestNewRefusesEveryPairThatCannotApplyTogether(t *testing.T) {
	h := HandlerFunc(func(context.Context, *kgo.Record) error { return nil })
	bh := BatchHandlerFunc(func(context.Context, []*kgo.Record) error { return nil })
	group := []ConsumerOpt{Brokers("127.0.0.1:1"), Topics("t"), Group("g")}
	share := []ConsumerOpt{Brokers("127.0.0.1:1"), Topics("t"), ShareGroup("s")}
	for _, tc := range []struct {
		a, b  string // the option names the error must contain
		base  []ConsumerOpt
		opts  []ConsumerOpt
		batch bool // NewBatch rather than New
	}{
		{"ShareGroup", "Group", share, []ConsumerOpt{Group("g")}, false},
		{"ShareGroup", "Ordering(ByPartition)", share, []ConsumerOpt{Ordering(ByPartition)}, false},
		{"ShareGroup", "RetryTopics", share, []ConsumerOpt{RetryTopics(time.Second)}, false},
		{"ShareGroup", "InstanceID", share, []ConsumerOpt{InstanceID("i")}, false},
		{"ShareGroup", "CommitMetadataBytes", share, []ConsumerOpt{CommitMetadataBytes(100)}, false},
		{"ShareGroup", "CommitInterval", share, []ConsumerOpt{CommitInterval(time.Second)}, false},
		{"ShareGroup", "CommitBudget", share, []ConsumerOpt{CommitBudget(100)}, false},
		{"ShareGroup", "RevokeTimeout", share, []ConsumerOpt{RevokeTimeout(time.Second)}, false},
		{"ShareGroup", "GroupProtocol", share, []ConsumerOpt{GroupProtocol(ConsumerProtocol)}, false},
		{"ShareGroup", "GroupProtocol", share, []ConsumerOpt{GroupProtocol(ClassicProtocol)}, false},
		{"ShareGroup", "ExactlyOnce", share, []ConsumerOpt{ExactlyOnce(), TransactionalID("x")}, false},
		{"TopicRegex", "RetryTopics", group, []ConsumerOpt{TopicRegex(), RetryTopics(time.Second)}, false},
		{"ExactlyOnce", "DeadLetters", group, []ConsumerOpt{ExactlyOnce(), InstanceID("i"), DeadLetters(nopSink{})}, false},
		{"TransactionalID", "ExactlyOnce", group, []ConsumerOpt{TransactionalID("x")}, false},
		{"BatchSize", "NewBatch", group, []ConsumerOpt{BatchSize(10)}, false},
		{"WindowRecords", "BatchSize", group, []ConsumerOpt{BatchSize(500), WindowRecords(100)}, true},
	} {
		t.Run(tc.a+" with "+tc.b, func(t *testing.T) {
			opts := append(append([]ConsumerOpt(nil), tc.base...), tc.opts...)
			var err error
			if tc.batch {
				_, err = NewBatch(bh, opts...)
			} else {
				_, err = New(h, opts...)
			}
			if err == nil {
				t.Fatalf("New accepted %s with %s", tc.a, tc.b)
			}
			if !strings.Contains(err.Error(), tc.a) || !strings.Contains(err.Error(), tc.b) {
				t.Fatalf("New: %v; want an error naming both %s and %s", err, tc.a, tc.b)
			}
		})
	}
	// Each option of a pair holds alone.
	for _, opts := range [][]ConsumerOpt{
		append(share[:3:3], Ordering(Unordered)),
		append(group[:3:3], GroupProtocol(ConsumerProtocol), CommitBudget(100), InstanceID("i")),
		append(group[:3:3], ExactlyOnce(), TransactionalID("x")),
	} {
		if _, err := New(h, opts...); err != nil {
			t.Fatalf("New: %v", err)
		}
	}
	if _, err := NewBatch(bh, append(group[:3:3], BatchSize(10))...); err != nil {
		t.Fatalf("NewBatch with BatchSize: %v", err)
	}
}

// TestBackfillValidatesItsOwnOptions: Backfill checks the flow rules and
// its own options, with no group or topics invented to pass a consumer's
// checks.
func TestBackfillValidatesItsOwnOptions(t *testing.T) {
	c, err := backfillConfig(Range{Topic: "t"}, []BackfillOpt{Brokers("127.0.0.1:1")})
	if err != nil || c.group != "" || len(c.topics) != 0 {
		t.Fatalf("backfillConfig: %v, group %q, topics %v; want no error and neither", err, c.group, c.topics)
	}
	for _, tc := range []struct {
		opts []BackfillOpt
		want string
	}{
		{nil, "no brokers"},
		{[]BackfillOpt{Brokers("127.0.0.1:1"), Concurrency(0)}, "Concurrency(0)"},
		{[]BackfillOpt{Brokers("127.0.0.1:1"), WindowRecords(2)}, "WindowRecords(2)"},
		{[]BackfillOpt{Brokers("127.0.0.1:1"), Readers(0)}, "Readers(0)"},
		{[]BackfillOpt{Brokers("127.0.0.1:1"), ClientOptions(kgo.ConsumerGroup("x"))}, "use kpar.Group"},
	} {
		if _, err := backfillConfig(Range{Topic: "t"}, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("backfillConfig: %v, want an error containing %q", err, tc.want)
		}
	}
}
