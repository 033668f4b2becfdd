package kpar_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// BenchmarkNoop consumes a pre-produced topic (8 partitions, 100-byte
// values, 1,000 keys) with a handler that does nothing: the raw franz-go poll
// loop is the ceiling, and kpar's per-record overhead is the gap. Each
// iteration consumes the whole topic with a fresh group; compare the
// records/s and cpu-ns/record metrics of the sub-benchmarks of one run.
func BenchmarkNoop(b *testing.B) {
	const records, partitions = 200_000, 8
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()
	fill(b, seeds, records)

	var group atomic.Int64
	nextGroup := func() string { return fmt.Sprintf("g%d", group.Add(1)) }

	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		start, cpu := time.Now(), cpuTime(b)
		for range b.N {
			rawLoop(b, seeds, nextGroup(), records)
		}
		b.ReportMetric(float64(records*b.N)/time.Since(start).Seconds(), "records/s")
		b.ReportMetric(float64(cpuTime(b)-cpu)/float64(records*b.N), "cpu-ns/record")
	})
	for _, mode := range []kpar.Order{kpar.Unordered, kpar.ByKey, kpar.ByPartition} {
		b.Run("kpar-"+mode.String(), func(b *testing.B) {
			b.ReportAllocs()
			pauses.n.Store(0)
			start, cpu := time.Now(), cpuTime(b)
			for range b.N {
				kparLoop(b, seeds, nextGroup(), records, mode)
			}
			b.ReportMetric(float64(records*b.N)/time.Since(start).Seconds(), "records/s")
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(records*b.N), "cpu-ns/record")
			b.ReportMetric(float64(pauses.n.Load())/float64(b.N), "pauses/op")
		})
	}
}

// cpuTime is the process's CPU time so far (user and system, broker
// included: kfake runs in process). Per record it is steadier than records/s
// on a machine shared with other work, which steals wall time, not CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func fill(b *testing.B, seeds []string, n int) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	value := make([]byte, 100)
	for i := range n {
		cl.Produce(context.Background(), &kgo.Record{Topic: "bench", Key: fmt.Appendf(nil, "k%d", i%1000), Value: value}, nil)
	}
	if err := cl.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// rawLoop is the ceiling: one client polling and touching every record.
func rawLoop(b *testing.B, seeds []string, group string, n int) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics("bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var sum int
	for seen := 0; seen < n; {
		fs := cl.PollFetches(context.Background())
		fs.EachRecord(func(r *kgo.Record) { sum += len(r.Value); seen++ })
	}
	if sum == 0 {
		b.Fatal("no bytes")
	}
}

// pauseCounter counts how often windows filled: each pause costs up to a
// fetch round trip when it is resumed.
type pauseCounter struct{ n atomic.Int64 }

func (p *pauseCounter) OnPartitionPaused(string, int32, int) { p.n.Add(1) }

var pauses = new(pauseCounter)

func kparLoop(b *testing.B, seeds []string, group string, n int, mode kpar.Order) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen atomic.Int64
	c, err := kpar.New(kpar.HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		if seen.Add(1) == int64(n) {
			cancel()
		}
		return nil
	}), kpar.Brokers(seeds...), kpar.Group(group), kpar.Topics("bench"), kpar.Ordering(mode), kpar.WithHooks(pauses))
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		b.Fatal(err)
	}
}
