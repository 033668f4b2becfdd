package kpar

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestLargeRecordsInFlightStayWithinMaxBufferedBytes: with records of 512
// KB on 8 partitions and 256 workers, the records handled at once weigh no
// more than MaxBufferedBytes plus one record, and a record larger than the
// bound is handled alone rather than never. Before admission was bounded
// record by record, a bound of 2 MiB let 165 such records be handled at
// once: the poller kept polling while a partition was unpaused, and one
// poll could be several times the bound.
func TestLargeRecordsInFlightStayWithinMaxBufferedBytes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		size       int   // each record's value
		bound      int64 // MaxBufferedBytes
		concurrent int   // the most records at once it allows
	}{
		{"records of 512 KB in a bound of 2 MiB", 512 << 10, 2 << 20, 4},
		{"records larger than the bound", 512 << 10, 256 << 10, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 64
			c := newCluster(t, "large", 8)
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var recs []*kgo.Record
			for range n {
				recs = append(recs, &kgo.Record{Topic: c.name("large"), Value: make([]byte, tc.size)})
			}
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			cl.Close()

			var (
				mu                   sync.Mutex
				inFlight, most       int64 // bytes, as MaxBufferedBytes counts them
				records, mostRecords int
				handled              atomic.Int64
			)
			done := make(chan struct{})
			h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
				size := recordSize(r)
				mu.Lock()
				inFlight += size
				records++
				most, mostRecords = max(most, inFlight), max(mostRecords, records)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond) // the handler's work: lets records pile up if admission allows
				mu.Lock()
				inFlight -= size
				records--
				mu.Unlock()
				if handled.Add(1) == n {
					close(done)
				}
				return nil
			})
			cons, err := New(h, append(testOpts(c, "g", "large"), Ordering(Unordered), Concurrency(256),
				MaxBufferedBytes(tc.bound))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			waitFor(t, done, 60*time.Second, "every record handled")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			one := int64(tc.size) + recordOverhead
			if most > tc.bound+one || mostRecords > tc.concurrent {
				t.Fatalf("%d records (%d bytes) handled at once with MaxBufferedBytes %d, want at most %d records and %d bytes (the bound plus one record)",
					mostRecords, most, tc.bound, tc.concurrent, tc.bound+one)
			}
			t.Logf("at most %d records (%d bytes) handled at once", mostRecords, most)
		})
	}
}
