package deadletter

import (
	"bytes"
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// syncBuffer is a log destination safe for the sink's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// headerValue is the last value of header k in hs, and whether it is there.
func headerValue(hs []kgo.RecordHeader, k string) (string, bool) {
	v := lastHeader(hs, k)
	return string(v), v != nil
}

// random is n bytes that do not compress: the broker sees their size.
func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// bigLetter is letterAt with a value of n random bytes.
func bigLetter(p int32, o int64, n int) Letter {
	l := letterAt("orders", p, o)
	l.Record.Value = random(n)
	l.Record.Headers = []kgo.RecordHeader{{Key: "trace", Value: []byte("abc")}}
	return l
}

// TestKafkaSinkCutsALetterTooLargeForItsTopic: a 5 MB record whose dead
// letter the client (ProducerBatchMaxBytes, 1 MB) or the broker
// (max.message.bytes, 1 MB) refuses is written without its value, with
// headers saying so, and logged once; the letters beside it in the batch
// are written whole (issue 28: it was retried forever).
func TestKafkaSinkCutsALetterTooLargeForItsTopic(t *testing.T) {
	const big = 5 << 20
	for _, tc := range []struct {
		name string
		opts []kgo.Opt
	}{
		{"RefusedByTheClient", nil},
		{"RefusedByTheBroker", []kgo.Opt{kgo.ProducerBatchMaxBytes(16 << 20)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := newCluster(t, kfake.SeedTopics(2, "orders.dlq"))
			var log syncBuffer
			sink := NewKafkaSink(newClient(t, c, tc.opts...), SinkLogger(slog.New(slog.NewTextHandler(&log, nil))))
			letters := []Letter{letterAt("orders", 0, 1), bigLetter(0, 2, big), letterAt("orders", 1, 3)}
			if err := sink.Write(ctx, letters); err != nil {
				t.Fatalf("Write: %v", err)
			}
			src, err := OpenSource(ctx, kafkaURL(c, "orders.dlq"))
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]Letter{}
			for _, l := range readAll(t, ctx, src) {
				got[l.ID()] = l
			}
			if len(got) != 3 {
				t.Fatalf("read %d letters, want 3", len(got))
			}
			for _, id := range []string{"orders/0/1", "orders/1/3"} {
				if l := got[id]; l.Truncated() || string(l.Record.Value) != "v" {
					t.Errorf("%s beside the big one: value %q, truncated %v", id, l.Record.Value, l.Truncated())
				}
			}
			l := got["orders/0/2"]
			if !l.Truncated() || l.Record.Value != nil || string(l.Record.Key) != "k" {
				t.Errorf("the big letter: truncated %v, value %d bytes, key %q; want the value alone left out", l.Truncated(), len(l.Record.Value), l.Record.Key)
			}
			if v, _ := headerValue(l.Record.Headers, HeaderValueTruncated); v != "true" {
				t.Errorf("%s = %q, want true", HeaderValueTruncated, v)
			}
			if v, _ := headerValue(l.Record.Headers, HeaderValueOriginalBytes); v != "5242880" {
				t.Errorf("%s = %q, want 5242880", HeaderValueOriginalBytes, v)
			}
			if _, cut := headerValue(l.Record.Headers, HeaderKeyTruncated); cut {
				t.Errorf("the key was cut too: %q", l.Record.Headers)
			}
			if v, _ := headerValue(l.Record.Headers, "trace"); v != "abc" || l.Message != "failed" || l.Group != "g" ||
				l.Class != ClassExhausted || l.Attempts != 4 || l.Record.Partition != 0 || l.Record.Offset != 2 {
				t.Errorf("the big letter lost its coordinates or error: %+v %q", l, l.Record.Headers)
			}
			if n := strings.Count(log.String(), "level=WARN"); n != 1 || !strings.Contains(log.String(), "record=orders/0/2") ||
				!strings.Contains(log.String(), "value_bytes=5242880") || !strings.Contains(log.String(), "MESSAGE_TOO_LARGE") {
				t.Errorf("logged %d warnings, want one naming the record, its size and the refusal:\n%s", n, log.String())
			}
		})
	}
}

// TestKafkaSinkCutsFurtherUntilTheLetterFits: on a topic whose
// max.message.bytes is 4 KiB, a letter with a large key and a large header
// loses its value, then its key and large header, keeping the small one;
// where nothing more can be cut, Write fails saying what to raise.
func TestKafkaSinkCutsFurtherUntilTheLetterFits(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t)
	cl := newClient(t, c, kgo.ProducerBatchMaxBytes(16<<20))
	adm := kadm.NewClient(cl)
	for topic, maxBytes := range map[string]string{"orders.dlq": "4096", "tiny.dlq": "200"} {
		if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, topic); err != nil {
			t.Fatal(err)
		}
	}
	sink := NewKafkaSink(cl)

	l := bigLetter(0, 7, 10<<10)
	l.Record.Key = random(8 << 10)
	l.Record.Headers = append(l.Record.Headers, kgo.RecordHeader{Key: "payload-copy", Value: random(2 << 10)})
	if err := sink.Write(ctx, []Letter{l}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	src, err := OpenSource(ctx, kafkaURL(c, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	got := readAll(t, ctx, src)
	if len(got) != 1 {
		t.Fatalf("read %d letters, want 1", len(got))
	}
	g := got[0]
	for k, want := range map[string]string{
		HeaderValueTruncated: "true", HeaderValueOriginalBytes: "10240",
		HeaderKeyTruncated: "true", HeaderKeyOriginalBytes: "8192",
		HeaderHeadersDropped: "payload-copy", "trace": "abc",
	} {
		if v, _ := headerValue(g.Record.Headers, k); v != want {
			t.Errorf("header %s = %q, want %q", k, v, want)
		}
	}
	if g.Record.Key != nil || g.Record.Value != nil || g.ID() != "orders/0/7" || g.Message != "failed" {
		t.Errorf("letter %s: key %d bytes, value %d bytes, message %q", g.ID(), len(g.Record.Key), len(g.Record.Value), g.Message)
	}

	// 200 bytes cannot hold even the dead-letter headers.
	tiny := NewKafkaSink(cl, SinkTopic("tiny.dlq"))
	err = tiny.Write(ctx, []Letter{bigLetter(0, 8, 1<<10)})
	if err == nil || !strings.Contains(err.Error(), "raise the max.message.bytes of tiny.dlq") || !strings.Contains(err.Error(), "orders/0/8") {
		t.Errorf("Write to a topic too small for any letter: %v, want an error naming the record and what to raise", err)
	}
}

// TestReplaySkipsCutLetters: a letter the sink cut is not replayed (the
// record would arrive without its value); another group's whole letter of
// the same record is.
func TestReplaySkipsCutLetters(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(1, "orders"))
	cut, marks, _ := shrunk(letterAt("orders", 0, 1), 1)
	cut.Record.Headers = append(cut.Record.Headers, marks...) // as a reader returns it
	whole := letterAt("orders", 0, 1)
	whole.Group = "other"
	rep, err := Replay(ctx, sliceSource{cut, whole}, newClient(t, c), ReplayRunID("r"), ReplayStateFile(t.TempDir()+"/j"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Truncated != 1 || rep.Replayed != 1 || rep.Duplicate != 0 {
		t.Errorf("report %+v, want the cut letter skipped and the whole one sent", rep)
	}
	recs := rawRecords(t, ctx, c, "orders")
	if len(recs) != 1 || string(recs[0].Value) != "v" {
		t.Errorf("orders holds %d records, want the whole letter's", len(recs))
	}
}

// sliceSource is a Source of fixed letters.
type sliceSource []Letter

func (s sliceSource) Read(_ context.Context, fn func(Letter) error) error {
	for _, l := range s {
		if err := fn(l); err != nil {
			return err
		}
	}
	return nil
}
