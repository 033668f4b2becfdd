package kparprom_test

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/kparprom"
)

// Metrics observes a Consumer through its hooks and its client; serve
// m.Handler() on /metrics in a real program.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An in-process Kafka-compatible broker (franz-go's kfake) with 50
	// records on "orders"; a real program names its brokers.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	var records []*kgo.Record
	for i := range 50 {
		records = append(records, &kgo.Record{Topic: "orders", Value: []byte(strconv.Itoa(i))})
	}
	if err := producer.ProduceSync(ctx, records...).FirstErr(); err != nil {
		log.Fatal(err)
	}
	producer.Close()

	m := kparprom.New()
	var handled atomic.Int64
	c, err := kpar.New(kpar.HandlerFunc(func(context.Context, *kgo.Record) error {
		if handled.Add(1) == 50 {
			cancel()
		}
		return nil
	}),
		kpar.Brokers(cluster.ListenAddrs()...),
		kpar.Group("billing"),
		kpar.Topics("orders"),
		kpar.WithHooks(m),                     // records, commits, rebalances
		kpar.ClientOptions(m.ClientOpts()...), // client metrics, lag, readiness
	)
	if err != nil {
		log.Fatal(err)
	}
	m.Registry().MustRegister(m.PartitionCollector(c.Partitions), m.OverdueCollector(c.Overdue))
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}

	families, err := m.Registry().Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		switch f.GetName() {
		case "kpar_records_handled_total", "kpar_attempts_overdue":
			var sum float64
			for _, s := range f.GetMetric() {
				sum += s.GetCounter().GetValue() + s.GetGauge().GetValue()
			}
			fmt.Println(f.GetName(), sum)
		}
	}
	// Output:
	// kpar_attempts_overdue 0
	// kpar_records_handled_total 50
}
