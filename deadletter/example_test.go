package deadletter_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// A Kafka sink needs a client of its own that places each dead letter on
// the partition of its original (kgo.ManualPartitioner); it writes to
// "<topic>.dlq" with kpar's headers unless told otherwise
// (deadletter.Dialect(deadletter.Spring) writes Spring Kafka's). Give the
// sink to kpar.DeadLetters; here it is written to directly and read back.
func ExampleNewKafkaSink() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An in-process Kafka-compatible broker (franz-go's kfake) with the
	// dead-letter topic; a real program names its brokers.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders.dlq"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	cl, err := kgo.NewClient(
		kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	sink := deadletter.NewKafkaSink(cl)
	letter := deadletter.Letter{
		Record:   &kgo.Record{Topic: "orders", Partition: 3, Offset: 1234, Value: []byte(`{"id":7}`)},
		Group:    "billing",
		Class:    deadletter.ClassExhausted,
		Message:  "charge failed",
		Attempts: 3,
	}
	if err := sink.Write(ctx, []deadletter.Letter{letter}); err != nil {
		log.Fatal(err)
	}

	src, err := deadletter.OpenSource(ctx, "kafka://"+cluster.ListenAddrs()[0]+"/orders.dlq")
	if err != nil {
		log.Fatal(err)
	}
	err = src.Read(ctx, func(l deadletter.Letter) error {
		fmt.Println(l.ID(), l.Group, l.Class, l.Attempts, l.Message)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: orders/3/1234 billing exhausted 3 charge failed
}

// Dead letters written to a file read back through OpenSource, copies
// dropped.
func ExampleOpenSource() {
	dir, _ := os.MkdirTemp("", "dlq")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "dlq.jsonl")

	ctx := context.Background()
	sink, err := deadletter.NewFileSink(path)
	if err != nil {
		panic(err)
	}
	letter := deadletter.Letter{
		Record:      &kgo.Record{Topic: "orders", Partition: 3, Offset: 1234, Value: []byte(`{"id":7}`)},
		Group:       "billing",
		Class:       deadletter.ClassExhausted,
		Message:     "charge failed",
		Attempts:    5,
		LastFailure: time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC),
	}
	// The second Write is a retry of the first: the reader keeps one.
	sink.Write(ctx, []deadletter.Letter{letter})
	sink.Write(ctx, []deadletter.Letter{letter})
	sink.Close()

	src, err := deadletter.OpenSource(ctx, "file://"+path)
	if err != nil {
		panic(err)
	}
	src.Read(ctx, func(l deadletter.Letter) error {
		fmt.Println(l.ID(), l.Class, l.Attempts, string(l.Record.Value))
		return nil
	})
	// Output:
	// orders/3/1234 exhausted 5 {"id":7}
}
