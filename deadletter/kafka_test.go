package deadletter

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// rawRecords reads every record of topic as it is stored, dead-letter
// headers included.
func rawRecords(t *testing.T, ctx context.Context, c *kfake.Cluster, topic string) []*kgo.Record {
	t.Helper()
	src, err := openKafkaSource(ctx, c.ListenAddrs(), []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	var out []*kgo.Record
	if err := readPartitions(ctx, []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, src.start, src.end, func(r *kgo.Record) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func letterAt(topic string, p int32, o int64) Letter {
	return Letter{
		Record: &kgo.Record{Topic: topic, Partition: p, Offset: o, Key: []byte("k"), Value: []byte("v"),
			Timestamp: ms("2024-02-03T04:05:06.789Z")},
		Group: "g", Class: ClassExhausted, Message: "failed", Attempts: 4,
		FirstFailure: ms("2024-02-03T05:00:00.000Z"), LastFailure: ms("2024-02-03T05:00:01.250Z"),
	}
}

func TestKafkaSinkPartitionMapping(t *testing.T) {
	for _, tc := range []struct {
		name       string
		dlqParts   int32
		wantForSrc func(p int32) int32
	}{
		{"FewerPartitionsWrapAround", 2, func(p int32) int32 { return p % 2 }},
		{"MorePartitionsKeepNumber", 8, func(p int32) int32 { return p }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := newCluster(t, kfake.SeedTopics(tc.dlqParts, "orders.dlq"))
			sink := NewKafkaSink(newClient(t, c))
			var letters []Letter
			for p := range int32(6) {
				for o := range int64(3) {
					letters = append(letters, letterAt("orders", p, o))
				}
			}
			if err := sink.Write(ctx, letters); err != nil {
				t.Fatal(err)
			}
			recs := rawRecords(t, ctx, c, "orders.dlq")
			if len(recs) != len(letters) {
				t.Fatalf("read %d records, want %d", len(recs), len(letters))
			}
			next := map[int32]int64{}
			for _, r := range recs {
				l := FromRecord(r)
				if want := tc.wantForSrc(l.Record.Partition); r.Partition != want {
					t.Errorf("dead letter of partition %d in dlq partition %d, want %d", l.Record.Partition, r.Partition, want)
				}
				if l.Record.Offset != next[l.Record.Partition] {
					t.Errorf("partition %d: offset %d out of order, want %d", l.Record.Partition, l.Record.Offset, next[l.Record.Partition])
				}
				next[l.Record.Partition]++
			}
		})
	}
}

func TestKafkaSinkKparHeaders(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(1, "orders.dlq"))
	l := letterAt("orders", 0, 42)
	l.Record.Headers = []kgo.RecordHeader{{Key: "trace", Value: []byte("t1")}}
	if err := NewKafkaSink(newClient(t, c)).Write(ctx, []Letter{l}); err != nil {
		t.Fatal(err)
	}
	recs := rawRecords(t, ctx, c, "orders.dlq")
	if len(recs) != 1 {
		t.Fatalf("read %d records, want 1", len(recs))
	}
	want := []kgo.RecordHeader{
		{Key: "trace", Value: []byte("t1")},
		{Key: HeaderTopic, Value: []byte("orders")},
		{Key: HeaderPartition, Value: []byte("0")},
		{Key: HeaderOffset, Value: []byte("42")},
		{Key: HeaderGroup, Value: []byte("g")},
		{Key: HeaderDeliveryCount, Value: []byte("4")},
		{Key: HeaderMessage, Value: []byte("failed")},
		{Key: HeaderClass, Value: []byte("exhausted")},
		{Key: HeaderFirstFailure, Value: []byte("2024-02-03T05:00:00.000Z")},
		{Key: HeaderLastFailure, Value: []byte("2024-02-03T05:00:01.250Z")},
		{Key: HeaderOriginalTimestamp, Value: []byte("2024-02-03T04:05:06.789Z")},
	}
	checkHeaders(t, recs[0].Headers, want)
	if string(recs[0].Key) != "k" || string(recs[0].Value) != "v" {
		t.Errorf("key/value %q/%q, want k/v", recs[0].Key, recs[0].Value)
	}
	if recs[0].Timestamp.Equal(l.Record.Timestamp) {
		t.Errorf("dead-letter record kept the original timestamp; want the time of writing")
	}
}

func checkHeaders(t *testing.T, got, want []kgo.RecordHeader) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("headers:\n got %q\nwant %q", got, want)
	}
	for i := range want {
		if got[i].Key != want[i].Key || string(got[i].Value) != string(want[i].Value) {
			t.Errorf("header %d = %q:%q, want %q:%q", i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
		}
	}
}

func TestKafkaSinkSpringDialect(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(3, "orders.DLT"))
	sink := NewKafkaSink(newClient(t, c), SinkDialect(Spring), SinkTopicFunc(func(src string) string { return src + ".DLT" }))
	want := sampleLetters("orders")
	if err := sink.Write(ctx, want); err != nil {
		t.Fatal(err)
	}

	// Round trip through the Kafka source.
	src, err := OpenSource(ctx, kafkaURL(c, "orders.DLT"))
	if err != nil {
		t.Fatal(err)
	}
	checkSameLetters(t, want, readAll(t, ctx, src))

	// The binary encodings Spring reads.
	recs := rawRecords(t, ctx, c, "orders.DLT")
	var found bool
	for _, r := range recs {
		if string(lastHeader(r.Headers, SpringOriginalTopic)) != "orders" {
			t.Fatalf("%s = %q", SpringOriginalTopic, lastHeader(r.Headers, SpringOriginalTopic))
		}
		if lastHeader(r.Headers, HeaderTopic) != nil {
			t.Errorf("spring dialect wrote %s", HeaderTopic)
		}
		p, o := lastHeader(r.Headers, SpringOriginalPartition), lastHeader(r.Headers, SpringOriginalOffset)
		if len(p) != 4 || len(o) != 8 {
			t.Fatalf("partition %x / offset %x: want 4 and 8 bytes", p, o)
		}
		if int32(binary.BigEndian.Uint32(p)) != 5 {
			continue
		}
		found = true
		if got := int64(binary.BigEndian.Uint64(o)); got != 123456789 {
			t.Errorf("offset header decodes to %d", got)
		}
		ts := lastHeader(r.Headers, SpringOriginalTimestamp)
		wantTS := want[3].Record.Timestamp.UnixMilli()
		if len(ts) != 8 || int64(binary.BigEndian.Uint64(ts)) != wantTS {
			t.Errorf("timestamp header %x, want 8-byte %d", ts, wantTS)
		}
		for k, v := range map[string]string{
			SpringOriginalTimestampType: "CreateTime",
			SpringOriginalConsumerGroup: "billing",
			SpringExceptionFQCN:         "kpar.error.panic",
			SpringExceptionMessage:      want[3].Message,
			SpringExceptionStacktrace:   want[3].Message,
		} {
			if got := string(lastHeader(r.Headers, k)); got != v {
				t.Errorf("%s = %q, want %q", k, got, v)
			}
		}
		if got := lastHeader(r.Headers, SpringOriginalPartition); string(got) != "\x00\x00\x00\x05" {
			t.Errorf("partition bytes %x", got)
		}
	}
	if !found {
		t.Fatal("no dead letter of partition 5")
	}
}

func TestKafkaSinkDefaultPartitionerStillDelivers(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(2, "orders.dlq"))
	cl := newClient(t, c, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	sink := NewKafkaSink(cl)
	if sink.manual {
		t.Fatal("a sticky key partitioner was taken for a manual one")
	}
	if !NewKafkaSink(newClient(t, c)).manual {
		t.Fatal("ManualPartitioner not recognised")
	}
	def, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer def.Close()
	if NewKafkaSink(def).manual {
		t.Fatal("the default partitioner was taken for a manual one")
	}
	want := sampleLetters("orders") // partitions up to 5, more than the topic has
	if err := sink.Write(ctx, want); err != nil {
		t.Fatal(err)
	}
	src, err := OpenSource(ctx, kafkaURL(c, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	checkSameLetters(t, want, readAll(t, ctx, src))
}

func TestKafkaSinkTopicOptions(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(1, "all-dead"))
	sink := NewKafkaSink(newClient(t, c), SinkTopic("all-dead"))
	want := []Letter{letterAt("a", 0, 1), letterAt("b", 3, 2)}
	if err := sink.Write(ctx, want); err != nil {
		t.Fatal(err)
	}
	src, err := OpenSource(ctx, kafkaURL(c, "all-dead"))
	if err != nil {
		t.Fatal(err)
	}
	checkSameLetters(t, want, readAll(t, ctx, src))
}

func TestKafkaSinkMissingTopic(t *testing.T) {
	t.Run("NoAutoCreate", func(t *testing.T) {
		ctx := testCtx(t)
		c := newCluster(t)
		err := NewKafkaSink(newClient(t, c)).Write(ctx, []Letter{letterAt("orders", 0, 1)})
		if err == nil || !strings.Contains(err.Error(), `"orders.dlq"`) || !errors.Is(err, kerr.UnknownTopicOrPartition) {
			t.Fatalf("Write = %v, want UNKNOWN_TOPIC_OR_PARTITION naming orders.dlq", err)
		}
	})
	t.Run("AutoCreate", func(t *testing.T) {
		ctx := testCtx(t)
		c := newCluster(t, kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2))
		sink := NewKafkaSink(newClient(t, c, kgo.AllowAutoTopicCreation()))
		want := []Letter{letterAt("orders", 0, 1), letterAt("orders", 3, 1)}
		if err := sink.Write(ctx, want); err != nil {
			t.Fatal(err)
		}
		src, err := OpenSource(ctx, kafkaURL(c, "orders.dlq"))
		if err != nil {
			t.Fatal(err)
		}
		checkSameLetters(t, want, readAll(t, ctx, src))
	})
}

// TestKafkaSinkOutage: while the broker refuses produce requests to the
// dead-letter topic, Write fails by its context's deadline; once the fault
// is gone, the same batch goes through.
func TestKafkaSinkOutage(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(2, "orders.dlq"))
	sink := NewKafkaSink(newClient(t, c, kgo.MetadataMinAge(100*time.Millisecond)))
	letters := []Letter{letterAt("orders", 0, 1), letterAt("orders", 1, 1)}

	fault := c.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Topic: "orders.dlq",
		Err:   kerr.NotEnoughReplicas, // retriable: the client keeps trying
		Count: -1,
	})
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	start := time.Now()
	err := sink.Write(wctx, letters)
	cancel()
	if err == nil {
		t.Fatal("Write succeeded during the outage")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, kerr.NotEnoughReplicas) {
		t.Fatalf("Write = %v, want the deadline or the broker's error", err)
	}
	// The client notices a done context when it next looks at the
	// retrying batch: after at most MetadataMinAge here.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Write took %v with a 2s deadline", d)
	}
	if fault.Hits() == 0 {
		t.Fatal("the fault never fired")
	}
	fault.Remove()
	if err := sink.Write(ctx, letters); err != nil {
		t.Fatalf("Write after the outage: %v", err)
	}
	src, err := OpenSource(ctx, kafkaURL(c, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	checkSameLetters(t, letters, readAll(t, ctx, src))
}
