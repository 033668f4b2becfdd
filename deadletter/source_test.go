package deadletter

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSourceKafkaStopsAtOpenHighWatermark: a Kafka source reads what was
// there when it was opened, then returns; later records wait for the next
// OpenSource.
func TestSourceKafkaStopsAtOpenHighWatermark(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(3, "orders.dlq"))
	sink := NewKafkaSink(newClient(t, c))
	first := []Letter{letterAt("orders", 0, 1), letterAt("orders", 1, 1), letterAt("orders", 1, 2)}
	if err := sink.Write(ctx, first); err != nil {
		t.Fatal(err)
	}
	src, err := OpenSource(ctx, kafkaURL(c, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	later := []Letter{letterAt("orders", 0, 2), letterAt("orders", 2, 1)}
	if err := sink.Write(ctx, later); err != nil {
		t.Fatal(err)
	}
	checkSameLetters(t, first, readAll(t, ctx, src))

	src, err = OpenSource(ctx, kafkaURL(c, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	checkSameLetters(t, append(first, later...), readAll(t, ctx, src))
}

// TestSourceKafkaEndsAtTransactionMarker: a partition whose last offset is
// a transaction's commit marker is still read to its end.
func TestSourceKafkaEndsAtTransactionMarker(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(1, "orders.dlq"))
	cl := newClient(t, c, kgo.TransactionalID("dlq-writer"))
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	want := []Letter{letterAt("orders", 0, 1), letterAt("orders", 0, 2)}
	if err := NewKafkaSink(cl).Write(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	src, err := OpenSource(ctx, kafkaURL(c, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	if end := src.(*kafkaSource).end["orders.dlq"][0]; end != 3 {
		t.Fatalf("end offset %d, want 3 (two records and a marker)", end)
	}
	checkSameLetters(t, want, readAll(t, ctx, src))
}

func TestSourceEmptyKafkaTopic(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(2, "orders.dlq"))
	src, err := OpenSource(ctx, kafkaURL(c, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, ctx, src); len(got) != 0 {
		t.Fatalf("read %d letters from an empty topic", len(got))
	}
}

func TestOpenSourceRejectsBadURLs(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t, kfake.SeedTopics(1, "exists"))
	for _, u := range []string{
		"",
		"orders.dlq",
		"ftp://host/x",
		"kafka://",
		"kafka://127.0.0.1:9092",
		"kafka:///topic",
		"file://",
		"postgres://u@h/db", // pgsink.OpenSource reads these
		kafkaURL(c, "missing"),
	} {
		if _, err := OpenSource(ctx, u); err == nil {
			t.Errorf("OpenSource(%q) accepted", u)
		}
	}
	brokers, topics, err := ParseKafkaURL("kafka://a:1,b:2/x,y")
	if err != nil || len(brokers) != 2 || len(topics) != 2 || brokers[1] != "b:2" || topics[1] != "y" {
		t.Fatalf("ParseKafkaURL = %q %q %v", brokers, topics, err)
	}
}
