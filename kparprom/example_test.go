package kparprom_test

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/internal/testkit"
	"github.com/kpar/kpar/kparprom"
)

// Metrics observes a Consumer through its hooks and its client; serve
// m.Handler() on /metrics in a real program.
func Example() {
	// An in-process broker with 50 records on topic "orders".
	records := make([]*kgo.Record, 50)
	for i := range records {
		records[i] = kgo.StringRecord(strconv.Itoa(i))
	}
	cluster := testkit.ExampleCluster([]string{"orders"}, records...)
	defer cluster.Close()

	m := kparprom.New()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
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
