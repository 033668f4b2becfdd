package kpar

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkReplies compares a handler with no outputs, with outputs
// produced at least once (Outputs), and exactly once (ExactlyOnce), for a
// handler that does nothing and one that takes 5 ms (Concurrency 256, as
// an I/O-bound service), in key mode over 8 partitions. Each input emits
// one reply. It reports records/s and, with replies, the latency from the
// end of an input's handler to its reply becoming visible to a
// read_committed reader (p50, p99). Run it once per sitting and compare
// within it: go test -run ^$ -bench BenchmarkReplies -benchtime 1x.
func BenchmarkReplies(b *testing.B) {
	for _, h := range []struct {
		name        string
		records     int
		work        time.Duration
		concurrency int
	}{
		{"noop", 100_000, 0, 64},
		{"5ms", 20_000, 5 * time.Millisecond, 256},
	} {
		for _, mode := range []string{"none", "at-least-once", "exactly-once"} {
			b.Run(h.name+"/"+mode, func(b *testing.B) {
				for range b.N {
					benchReplies(b, h.records, h.work, h.concurrency, mode)
				}
			})
		}
	}
}

func benchReplies(b *testing.B, n int, work time.Duration, concurrency int, mode string) {
	b.StopTimer()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, "in"), kfake.SeedTopics(8, "out"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	produce(b, c, "in", n, 1000)

	var (
		mu       sync.Mutex
		handled  = make(map[[2]int64]time.Time, n)
		visible  = make(map[[2]int64]time.Time, n)
		finished = make(chan struct{})
		count    int
	)
	note := func() {
		count++
		if count == n {
			close(finished)
		}
	}
	h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if work > 0 {
			time.Sleep(work)
		}
		if mode != "none" {
			if err := Emit(ctx, outputOf("out", r)); err != nil {
				return err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		k := [2]int64{int64(r.Partition), r.Offset}
		if _, ok := handled[k]; !ok {
			handled[k] = time.Now()
			if mode == "none" {
				note()
			}
		}
		return nil
	})
	opts := []ConsumerOpt{Brokers(c.ListenAddrs()...), Group("bench"), Topics("in"), Concurrency(concurrency), InstanceID("bench-1")}
	switch mode {
	case "at-least-once":
		opts = append(opts, Outputs())
	case "exactly-once":
		opts = append(opts, ExactlyOnce())
	}
	cons, err := New(h, opts...)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	if mode != "none" {
		reader, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("out"),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(10*time.Millisecond))
		if err != nil {
			b.Fatal(err)
		}
		defer reader.Close()
		wg.Go(func() {
			for ctx.Err() == nil {
				fs := reader.PollFetches(ctx)
				now := time.Now()
				mu.Lock()
				fs.EachRecord(func(o *kgo.Record) {
					p, off, _ := inputOf(o)
					k := [2]int64{int64(p), off}
					if _, ok := visible[k]; !ok {
						visible[k] = now
						note()
					}
				})
				mu.Unlock()
			}
		})
	}
	b.StartTimer()
	start := time.Now()
	wg.Go(func() { _ = cons.Run(ctx) })
	select {
	case <-finished:
	case <-time.After(2 * time.Minute):
		b.Fatalf("%d of %d records in 2 minutes", count, n)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	wg.Wait()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "records/s")
	if mode == "none" {
		return
	}
	var lat []time.Duration
	for k, v := range visible {
		if h, ok := handled[k]; ok {
			lat = append(lat, v.Sub(h))
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
}
