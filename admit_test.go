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
			produceSized(t, c.ListenAddrs(), c.name("large"), n, tc.size)
			h := newBytesInFlight(n)
			cons, err := New(h, append(testOpts(c, "g", "large"), Ordering(Unordered), Concurrency(256),
				MaxBufferedBytes(tc.bound))...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, cons)
			waitFor(t, h.done, 60*time.Second, "every record handled")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			one := int64(tc.size) + recordOverhead
			if h.most > tc.bound+one || h.mostRecords > tc.concurrent {
				t.Fatalf("%d records (%d bytes) handled at once with MaxBufferedBytes %d, want at most %d records and %d bytes (the bound plus one record)",
					h.mostRecords, h.most, tc.bound, tc.concurrent, tc.bound+one)
			}
			t.Logf("at most %d records (%d bytes) handled at once", h.mostRecords, h.most)
		})
	}
}

// bytesInFlight is a handler that takes 5ms a record and counts the most
// records, and bytes as MaxBufferedBytes counts them, it handles at once;
// done closes once it handled n.
type bytesInFlight struct {
	n    int64
	done chan struct{}

	handled              atomic.Int64
	mu                   sync.Mutex // guards the fields below
	inFlight, most       int64
	records, mostRecords int
}

func newBytesInFlight(n int) *bytesInFlight {
	return &bytesInFlight{n: int64(n), done: make(chan struct{})}
}

func (b *bytesInFlight) Handle(_ context.Context, r *kgo.Record) error {
	size := recordSize(r)
	b.mu.Lock()
	b.inFlight += size
	b.records++
	b.most, b.mostRecords = max(b.most, b.inFlight), max(b.mostRecords, b.records)
	b.mu.Unlock()
	time.Sleep(5 * time.Millisecond) // the handler's work: lets records pile up if admission allows
	b.mu.Lock()
	b.inFlight -= size
	b.records--
	b.mu.Unlock()
	if b.handled.Add(1) == b.n {
		close(b.done)
	}
	return nil
}

// produceSized produces n records of size bytes to topic, round robin.
func produceSized(t *testing.T, brokers []string, topic string, n, size int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for range n {
		recs = append(recs, &kgo.Record{Topic: topic, Value: make([]byte, size)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}
