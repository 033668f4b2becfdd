package deadletter_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// A client for dead letters places each on the partition matching its
// original's; the sink writes to "<topic>.dlq" with kpar's headers unless
// told otherwise.
func ExampleNewKafkaSink() {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers("localhost:9092"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	)
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	sink := deadletter.NewKafkaSink(cl, deadletter.SinkDialect(deadletter.Spring))
	_ = sink // pass to kpar.DeadLetters(sink)
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
