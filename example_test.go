package kpar_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
)

// A Consumer in a consumer group: many records of each partition in flight,
// one record per key at a time, commits only below finished records.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An in-process Kafka-compatible broker (franz-go's kfake) with 100
	// orders of 10 customers on "orders"; a real program names its brokers.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	var orders []*kgo.Record
	for i := range 100 {
		orders = append(orders, &kgo.Record{
			Topic: "orders",
			Key:   fmt.Appendf(nil, "customer-%d", i%10),
			Value: fmt.Appendf(nil, "order-%d", i),
		})
	}
	if err := producer.ProduceSync(ctx, orders...).FirstErr(); err != nil {
		log.Fatal(err)
	}
	producer.Close()

	var handled atomic.Int64
	c, err := kpar.New(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		// Records of one customer arrive one at a time, in order;
		// different customers are handled in parallel.
		if handled.Add(1) == 100 {
			cancel() // stop once everything was handled
		}
		return nil // done; an error would be retried
	}),
		kpar.Brokers(cluster.ListenAddrs()...),
		kpar.Group("billing"),
		kpar.Topics("orders"),
		kpar.Concurrency(16),
		kpar.Ordering(kpar.ByKey),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // drains and commits on the way out
		log.Fatal(err)
	}
	fmt.Println("handled", handled.Load())
	// Output: handled 100
}

// A batch handler gets up to BatchSize records of one partition (and one
// key, in ByKey mode) at once, in offset order: one database round trip
// for many records.
func ExampleNewBatch() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An in-process Kafka-compatible broker (franz-go's kfake) with 100
	// orders of 10 customers on "orders"; a real program names its brokers.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	var orders []*kgo.Record
	for i := range 100 {
		orders = append(orders, &kgo.Record{
			Topic: "orders",
			Key:   fmt.Appendf(nil, "customer-%d", i%10),
			Value: fmt.Appendf(nil, "order-%d", i),
		})
	}
	if err := producer.ProduceSync(ctx, orders...).FirstErr(); err != nil {
		log.Fatal(err)
	}
	producer.Close()

	var handled atomic.Int64
	c, err := kpar.NewBatch(kpar.BatchHandlerFunc(func(ctx context.Context, rs []*kgo.Record) error {
		if handled.Add(int64(len(rs))) == 100 {
			cancel()
		}
		return nil // an error fails (and retries) every record of rs
	}),
		kpar.Brokers(cluster.ListenAddrs()...),
		kpar.Group("billing"),
		kpar.Topics("orders"),
		kpar.Ordering(kpar.ByPartition),
		kpar.BatchSize(20),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("handled", handled.Load())
	// Output: handled 100
}

// progress is a hook: any value implementing one or more HookX interfaces.
// Hooks are called from kpar's goroutines, so they must be safe for
// concurrent use and fast.
type progress struct {
	done   atomic.Int64
	failed atomic.Int64
	stop   context.CancelFunc
}

func (p *progress) OnRecordDone(r *kgo.Record, attempts int, latency time.Duration) {
	if p.done.Add(1) == 100 {
		p.stop()
	}
}

func (p *progress) OnAttemptFailed(r *kgo.Record, attempt int, err error, retryIn time.Duration) {
	p.failed.Add(1)
}

var (
	_ kpar.HookRecordDone    = (*progress)(nil)
	_ kpar.HookAttemptFailed = (*progress)(nil)
)

func ExampleWithHooks() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An in-process Kafka-compatible broker (franz-go's kfake) with 100
	// orders of 10 customers on "orders"; a real program names its brokers.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	var orders []*kgo.Record
	for i := range 100 {
		orders = append(orders, &kgo.Record{
			Topic: "orders",
			Key:   fmt.Appendf(nil, "customer-%d", i%10),
			Value: fmt.Appendf(nil, "order-%d", i),
		})
	}
	if err := producer.ProduceSync(ctx, orders...).FirstErr(); err != nil {
		log.Fatal(err)
	}
	producer.Close()

	hook := &progress{stop: cancel}
	var calls atomic.Int64
	c, err := kpar.New(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if calls.Add(1)%10 == 0 {
			return fmt.Errorf("flaky downstream") // retried after RetryBackoff
		}
		return nil
	}),
		kpar.Brokers(cluster.ListenAddrs()...),
		kpar.Group("billing"),
		kpar.Topics("orders"),
		kpar.RetryBackoff(time.Millisecond, 10*time.Millisecond),
		kpar.WithHooks(hook),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("done", hook.done.Load(), "with some failed attempts:", hook.failed.Load() > 0)
	// Output: done 100 with some failed attempts: true
}

// A record that keeps failing goes through the retry topics, each with its
// delay, without holding back its partition, and then to the dead-letter
// topic: MaxAttempts on the original topic, then one attempt per retry
// topic (itself a delayed retry). The sink here writes to Kafka
// ("<topic>.dlq").
func ExampleRetryTopics() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An in-process Kafka-compatible broker (franz-go's kfake) with 20
	// orders of 10 customers on "orders"; a real program names its brokers.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders", "orders.dlq"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	var orders []*kgo.Record
	for i := range 20 {
		orders = append(orders, &kgo.Record{
			Topic: "orders",
			Key:   fmt.Appendf(nil, "customer-%d", i%10),
			Value: fmt.Appendf(nil, "order-%d", i),
		})
	}
	if err := producer.ProduceSync(ctx, orders...).FirstErr(); err != nil {
		log.Fatal(err)
	}
	producer.Close()

	dlq, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.RecordPartitioner(kgo.ManualPartitioner())) // a dead letter keeps its partition
	if err != nil {
		log.Fatal(err)
	}
	defer dlq.Close()
	var ok atomic.Int64
	dead := make(chan deadletter.Letter, 1)
	c, err := kpar.New(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if string(r.Value) == "order-7" {
			return fmt.Errorf("order-7: card declined")
		}
		ok.Add(1)
		return nil
	}),
		kpar.Brokers(cluster.ListenAddrs()...),
		kpar.Group("billing"),
		kpar.Topics("orders"),
		kpar.MaxAttempts(2),
		kpar.RetryBackoff(time.Millisecond, 10*time.Millisecond),
		kpar.RetryTopics(50*time.Millisecond, 100*time.Millisecond), // orders.retry.1, orders.retry.2
		kpar.DeadLetters(deadletter.NewKafkaSink(dlq)),
		kpar.WithHooks(deadLettered(func(l deadletter.Letter) { dead <- l })),
	)
	if err != nil {
		log.Fatal(err)
	}
	go func() { <-dead; cancel() }()
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}

	src, err := deadletter.OpenSource(context.Background(), "kafka://"+cluster.ListenAddrs()[0]+"/orders.dlq")
	if err != nil {
		log.Fatal(err)
	}
	src.Read(context.Background(), func(l deadletter.Letter) error {
		fmt.Printf("%s: %s after %d attempts: %s\n", l.Record.Value, l.Class, l.Attempts, l.Message)
		return nil
	})
	fmt.Println("handled", ok.Load())
	// Output:
	// order-7: exhausted after 4 attempts: order-7: card declined
	// handled 19
}

// deadLettered adapts a function to kpar.HookDeadLettered.
type deadLettered func(deadletter.Letter)

func (f deadLettered) OnDeadLettered(l deadletter.Letter) { f(l) }

// A Permanent error skips the retries. The file sink appends JSON Lines and
// fsyncs them before the record counts as finished.
func ExampleDeadLetters() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An in-process Kafka-compatible broker (franz-go's kfake) with 20
	// orders of 10 customers on "orders"; a real program names its brokers.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	var orders []*kgo.Record
	for i := range 20 {
		orders = append(orders, &kgo.Record{
			Topic: "orders",
			Key:   fmt.Appendf(nil, "customer-%d", i%10),
			Value: fmt.Appendf(nil, "order-%d", i),
		})
	}
	if err := producer.ProduceSync(ctx, orders...).FirstErr(); err != nil {
		log.Fatal(err)
	}
	producer.Close()

	dir, err := os.MkdirTemp("", "kpar-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "dead-letters.jsonl")
	sink, err := deadletter.NewFileSink(path)
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close()
	c, err := kpar.New(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if string(r.Value) == "order-3" {
			return kpar.Permanent(fmt.Errorf("order-3: malformed"))
		}
		return nil
	}),
		kpar.Brokers(cluster.ListenAddrs()...),
		kpar.Group("billing"),
		kpar.Topics("orders"),
		kpar.DeadLetters(sink),
		kpar.WithHooks(deadLettered(func(deadletter.Letter) { cancel() })),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}

	src, err := deadletter.OpenSource(context.Background(), "file://"+path)
	if err != nil {
		log.Fatal(err)
	}
	src.Read(context.Background(), func(l deadletter.Letter) error {
		fmt.Printf("%s at %s/%d: %s (%d attempt)\n", l.Record.Value, l.Record.Topic, l.Record.Partition, l.Message, l.Attempts)
		return nil
	})
	// Output: order-3 at orders/2: permanent: order-3: malformed (1 attempt)
}

// With ShareGroup the broker hands the records of every partition to every
// member of the group (KIP-932): members are not limited by the partition
// count. The handler, retries and dead letters are the Consumer's; each
// outcome becomes an acknowledgement.
func ExampleShareGroup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An in-process Kafka-compatible broker (franz-go's kfake) with 100
	// orders of 10 customers on "orders"; a real program names its brokers.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	var orders []*kgo.Record
	for i := range 100 {
		orders = append(orders, &kgo.Record{
			Topic: "orders",
			Key:   fmt.Appendf(nil, "customer-%d", i%10),
			Value: fmt.Appendf(nil, "order-%d", i),
		})
	}
	if err := producer.ProduceSync(ctx, orders...).FirstErr(); err != nil {
		log.Fatal(err)
	}
	producer.Close()

	var handled, failedOnce atomic.Int64
	c, err := kpar.New(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		// A failure is retried here with backoff while this member
		// holds the record; the broker does not redeliver it.
		if r.Offset == 3 && failedOnce.Add(1) == 1 {
			return fmt.Errorf("downstream timeout")
		}
		if handled.Add(1) == 100 {
			cancel()
		}
		return nil // ACCEPT
	}),
		kpar.Brokers(cluster.ListenAddrs()...),
		kpar.ShareGroup("billing-workers"), // instead of Group
		kpar.Topics("orders"),
		kpar.Ordering(kpar.Unordered), // share groups order nothing; ByKey: one per key in this process
		kpar.RetryBackoff(time.Millisecond, 10*time.Millisecond),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
	st, _ := c.ShareStats()
	fmt.Println("handled", handled.Load(), "accepted", st.Accepted, "redelivered", st.Redelivered)
	// Output: handled 100 accepted 100 redelivered 0
}
