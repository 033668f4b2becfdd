package deadletter

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/testkit"
)

func testCtx(t *testing.T) context.Context { return testkit.Context(t, time.Minute) }

func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster { return testkit.Cluster(t, opts...) }

// newClient is a client on c; ManualPartitioner unless opts say otherwise.
func newClient(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	base := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner())}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func kafkaURL(c *kfake.Cluster, topic string) string {
	return "kafka://" + strings.Join(c.ListenAddrs(), ",") + "/" + topic
}

func closedPort(t *testing.T) string { return testkit.ClosedPort(t) }

// ms is a time with Kafka's precision.
func ms(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.Truncate(time.Millisecond)
}

// sampleLetters are dead letters of topic that exercise every byte-level
// corner: nil versus empty key and value, binary bytes, no headers,
// duplicate header keys, nil and empty header values, a header key that is
// not UTF-8, unknown failure times, every class.
func sampleLetters(topic string) []Letter {
	bin := []byte{0x00, 0xff, 0x10, '\n', '"', 0x80}
	mk := func(p int32, o int64, key, val []byte, hs ...kgo.RecordHeader) *kgo.Record {
		return &kgo.Record{Topic: topic, Partition: p, Offset: o, Key: key, Value: val, Headers: hs,
			Timestamp: ms("2024-05-06T07:08:09.123Z").Add(time.Duration(o) * time.Second)}
	}
	h := func(k string, v []byte) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: v} }
	first, last := ms("2024-05-06T08:00:00.001Z"), ms("2024-05-06T08:00:05.999Z")
	return []Letter{
		{Record: mk(0, 10, []byte("k0"), []byte("v0"), h("trace", []byte("abc"))),
			Group: "billing", Class: ClassExhausted, Message: "charge failed: card 1234 declined", Attempts: 5, FirstFailure: first, LastFailure: last},
		{Record: mk(0, 11, nil, nil),
			Group: "billing", Class: ClassPermanent, Message: "bad payload", Attempts: 1, LastFailure: last},
		{Record: mk(1, 7, []byte{}, []byte{}, h("dup", []byte("1")), h("dup", []byte("2")), h("nil", nil), h("empty", []byte{})),
			Group: "billing", Class: ClassTimeout, Message: "attempt timed out after 5s", Attempts: 3, FirstFailure: first, LastFailure: last},
		{Record: mk(5, 123456789, bin, bin, h("bin", bin), h("k\xffey", []byte("not utf-8 key"))),
			Group: "billing", Class: ClassPanic, Message: "panic: runtime error: index out of range [3] with length 3\n\ngoroutine 7 [running]:\nmain.handle()", Attempts: 1, FirstFailure: first, LastFailure: last},
		{Record: mk(2, 0, []byte("ключ"), []byte("значение ✓"), h("ünïcode", []byte("✓"))),
			Group: "billing", Class: ClassExhausted, Message: "übergroß: 3 of 3 attempts failed", Attempts: 3, FirstFailure: first, LastFailure: last},
	}
}

// readAll reads every dead letter of src.
func readAll(t *testing.T, ctx context.Context, src Source) []Letter {
	t.Helper()
	var got []Letter
	if err := src.Read(ctx, func(l Letter) error {
		got = append(got, l)
		return nil
	}); err != nil {
		t.Fatalf("Read: %v", err)
	}
	return got
}

// diffLetter describes how got differs from want, "" when they are equal:
// bytes compared exactly, nil and empty told apart, times by instant.
func diffLetter(want, got Letter) string {
	var d []string
	f := func(format string, a ...any) { d = append(d, fmt.Sprintf(format, a...)) }
	w, g := want.Record, got.Record
	if g == nil {
		return "no record"
	}
	if w.Topic != g.Topic || w.Partition != g.Partition || w.Offset != g.Offset {
		f("location %s/%d/%d, want %s/%d/%d", g.Topic, g.Partition, g.Offset, w.Topic, w.Partition, w.Offset)
	}
	if !sameBytes(w.Key, g.Key) {
		f("key %q (nil %v), want %q (nil %v)", g.Key, g.Key == nil, w.Key, w.Key == nil)
	}
	if !sameBytes(w.Value, g.Value) {
		f("value %q (nil %v), want %q (nil %v)", g.Value, g.Value == nil, w.Value, w.Value == nil)
	}
	if len(w.Headers) != len(g.Headers) {
		f("headers %q, want %q", g.Headers, w.Headers)
	} else {
		for i := range w.Headers {
			if w.Headers[i].Key != g.Headers[i].Key || !sameBytes(w.Headers[i].Value, g.Headers[i].Value) {
				f("header %d = %q:%q (nil %v), want %q:%q (nil %v)", i,
					g.Headers[i].Key, g.Headers[i].Value, g.Headers[i].Value == nil,
					w.Headers[i].Key, w.Headers[i].Value, w.Headers[i].Value == nil)
			}
		}
	}
	if !w.Timestamp.Equal(g.Timestamp) {
		f("timestamp %v, want %v", g.Timestamp, w.Timestamp)
	}
	if want.Group != got.Group || want.Class != got.Class || want.Message != got.Message || want.Attempts != got.Attempts {
		f("group/class/message/attempts %q/%q/%q/%d, want %q/%q/%q/%d",
			got.Group, got.Class, got.Message, got.Attempts, want.Group, want.Class, want.Message, want.Attempts)
	}
	if !want.FirstFailure.Equal(got.FirstFailure) || !want.LastFailure.Equal(got.LastFailure) {
		f("failures %v..%v, want %v..%v", got.FirstFailure, got.LastFailure, want.FirstFailure, want.LastFailure)
	}
	return strings.Join(d, "; ")
}

func sameBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

// checkSameLetters checks that got holds exactly want, each letter (group
// and original record) once, and that each group's letters of an original
// partition come in the order written.
func checkSameLetters(t *testing.T, want, got []Letter) {
	t.Helper()
	key := func(l Letter) string { return l.Group + " " + l.ID() }
	byKey := make(map[string]Letter)
	for _, l := range want {
		byKey[key(l)] = l
	}
	seen := make(map[string]bool)
	lastOffset := make(map[string]int64)
	for _, g := range got {
		k := key(g)
		w, ok := byKey[k]
		if !ok {
			t.Errorf("unexpected dead letter %s", k)
			continue
		}
		if seen[k] {
			t.Errorf("dead letter %s read twice", k)
		}
		seen[k] = true
		if d := diffLetter(w, g); d != "" {
			t.Errorf("%s: %s", k, d)
		}
		tp := fmt.Sprintf("%s %s/%d", g.Group, g.Record.Topic, g.Record.Partition)
		if prev, ok := lastOffset[tp]; ok && g.Record.Offset < prev {
			t.Errorf("%s read after offset %d of the same partition", k, prev)
		}
		lastOffset[tp] = g.Record.Offset
	}
	for k := range byKey {
		if !seen[k] {
			t.Errorf("dead letter %s missing", k)
		}
	}
}
