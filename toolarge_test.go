package kpar

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// TestTooLargeForItsTopicIsDeadLettered: a record whose output, retry-topic
// record or dead letter its topic refuses as too large (max.message.bytes)
// does not hold the commits: at least once and exactly once alike, an
// output or a retry record that does not fit sends its input to the dead
// letters saying why (never "overloaded", never produced again for ever),
// a dead letter that does not fit is cut, and every other record's output
// is produced and committed.
func TestTooLargeForItsTopicIsDeadLettered(t *testing.T) {
	for _, eos := range []bool{false, true} {
		for _, what := range []string{"output", "retry record", "dead letter"} {
			name := "at-least-once/" + what
			if eos {
				name = "exactly-once/" + what
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				tooLargeCase(t, eos, what)
			})
		}
	}
}

func tooLargeCase(t *testing.T, eos bool, what string) {
	const n, big, limit = 20, 7, 16 << 10
	c := newFakeCluster(t, notPorted, "in", 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	small := fmt.Sprint(limit)
	adm := kadm.NewClient(cl)
	create := func(topic string, max *string) {
		t.Helper()
		var cfg map[string]*string
		if max != nil {
			cfg = map[string]*string{"max.message.bytes": max}
		}
		if _, err := adm.CreateTopic(t.Context(), 1, 1, cfg, topic); err != nil {
			t.Fatal(err)
		}
	}
	var outLimit, retryLimit, dlqLimit *string
	switch what {
	case "output":
		outLimit = &small
	case "retry record":
		retryLimit = &small
	case "dead letter":
		dlqLimit = &small
	}
	create("out", outLimit)
	create("in.dlq", dlqLimit)
	var recs []*kgo.Record
	for i := range n {
		v := fmt.Appendf(nil, "v%d", i)
		if i == big && what != "output" {
			v = randomBytes(4 * limit) // random: compressed, it stays too large
		}
		recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i%3), Value: v})
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		out := outputOf("out", r)
		if r.Offset == big {
			switch what {
			case "output":
				out.Value = append(out.Value, randomBytes(4*limit)...)
			case "retry record":
				return errors.New("downstream busy")
			case "dead letter":
				return Permanent(errors.New("malformed"))
			}
		}
		return Emit(ctx, out)
	})
	done := &commitReaches{want: n, reached: make(chan struct{})}
	opts := append(testOpts(c, "g", "in"), MaxAttempts(1), InstanceID("m1"),
		DeadLetters(deadletter.NewKafkaSink(cl)), WithHooks(done))
	if what == "retry record" {
		create(RetryTopic("in", 1), retryLimit)
		opts = append(opts, RetryTopics(time.Minute))
	}
	if eos {
		opts = append(opts, ExactlyOnce())
	} else {
		opts = append(opts, Outputs())
	}
	cons, err := New(h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	waitFor(t, done.reached, 30*time.Second, fmt.Sprintf("the commit of all %d records (the %s too large for its topic held it back)", n, what))
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	letters := readOutputs(t, c, "in.dlq", 1, 20*time.Second)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1 (offset %d)", len(letters), big)
	}
	l := deadletter.FromRecord(letters[0])
	if l.Record.Offset != big {
		t.Errorf("dead letter of offset %d, want %d", l.Record.Offset, big)
	}
	switch what {
	case "dead letter":
		if !l.Truncated() {
			t.Errorf("the dead letter is whole (%d bytes of value); want it cut to fit", len(l.Record.Value))
		}
	default:
		if !strings.Contains(l.Message, "too large") || strings.Contains(strings.ToLower(l.Message), "overload") {
			t.Errorf("dead letter message %q, want the refusal as too large (and no overload)", l.Message)
		}
	}
	outs := readOutputs(t, c, "out", n-1, 20*time.Second)
	got := map[int64]int{}
	for _, o := range outs {
		_, off, _ := inputOf(o)
		got[off]++
	}
	for i := range int64(n) {
		want := 1
		if i == big {
			want = 0
		}
		if got[i] < want || (eos && got[i] != want) || (i == big && got[i] != 0) {
			t.Errorf("offset %d has %d outputs, want %d", i, got[i], want)
		}
	}
}

// randomBytes returns n random bytes, which compression cannot shrink.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// commitReaches is a commit hook that closes reached once partition 0 of
// every topic it hears of is committed up to want.
type commitReaches struct {
	want    int64
	once    sync.Once
	reached chan struct{}
}

func (c *commitReaches) OnCommit(offs map[string]map[int32]int64, _ error) {
	for _, ps := range offs {
		if ps[0] >= c.want {
			c.once.Do(func() { close(c.reached) })
		}
	}
}
