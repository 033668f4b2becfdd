package kpar_test

import (
	"context"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

func Example() {
	// An in-process broker with one topic of 4 partitions and 100 records.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	producer, _ := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	for i := range 100 {
		producer.Produce(context.Background(), &kgo.Record{
			Topic: "orders",
			Key:   fmt.Appendf(nil, "customer-%d", i%10),
			Value: fmt.Appendf(nil, "order-%d", i),
		}, nil)
	}
	producer.Flush(context.Background())
	producer.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var handled atomic.Int64
	c, err := kpar.New(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		// Records of one customer arrive one at a time, in order;
		// different customers are handled in parallel.
		if handled.Add(1) == 100 {
			cancel() // stop once everything was handled
		}
		return nil
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
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("handled", handled.Load())
	// Output: handled 100
}
