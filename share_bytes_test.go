package kpar

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestShareGroupRecordsStayWithinMaxBufferedBytes: a share-group member
// holds MaxBufferedBytes record by record, as a group member does. With
// records of 64 KB, a bound of 512 KiB and 256 workers, the records handled
// at once weigh no more than the bound plus one record; the acquired
// records that wait for room stay acquired (their locks renewed) until
// bytes free. Before, a share group admitted whole polls: 192 records
// (12.6 MB) handled at once.
func TestShareGroupRecordsStayWithinMaxBufferedBytes(t *testing.T) {
	const (
		n     = 192
		size  = 64 << 10
		bound = 512 << 10
	)
	c := newShareCluster(t, "shbytes", 4, 5*time.Second, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for range n {
		recs = append(recs, &kgo.Record{Topic: "shbytes", Value: make([]byte, size)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()

	var (
		mu              sync.Mutex
		inFlight, most  int64 // bytes, as MaxBufferedBytes counts them
		records, mostRs int
		handled         atomic.Int64
	)
	done := make(chan struct{})
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		sz := recordSize(r)
		mu.Lock()
		inFlight += sz
		records++
		most, mostRs = max(most, inFlight), max(mostRs, records)
		mu.Unlock()
		time.Sleep(5 * time.Millisecond) // the handler's work: lets records pile up if admission allows
		mu.Lock()
		inFlight -= sz
		records--
		mu.Unlock()
		if handled.Add(1) == n {
			close(done)
		}
		return nil
	})
	cons, stop := runShare(t, c, "shbytes", h, Ordering(Unordered), Concurrency(256), MaxBufferedBytes(bound))
	var acquired atomic.Int64 // the most records the member held acquired at once
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond): // sampling, not waiting for anything
			}
			if st, ok := cons.ShareStats(); ok {
				acquired.Store(max(acquired.Load(), int64(st.Acquired)))
			}
		}
	}()
	waitFor(t, done, 60*time.Second, "every record handled")
	<-sampled
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	one := int64(size) + recordOverhead
	if most > bound+one {
		t.Errorf("%d records (%d bytes) handled at once with MaxBufferedBytes %d, want at most %d bytes (the bound plus one record)",
			mostRs, most, bound, bound+one)
	}
	t.Logf("at most %d records (%d bytes) handled at once, %d records acquired", mostRs, most, acquired.Load())
}

// TestShareShutdownReleasesRecordsWaitingForMaxBufferedBytes, in virtual
// time: of a poll larger than MaxBufferedBytes, the records it has no room
// for wait, acquired and handed to nobody; at shutdown they are released
// with those queued, and the running record is accepted.
func TestShareShutdownReleasesRecordsWaitingForMaxBufferedBytes(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	synctest.Test(t, func(t *testing.T) {
		proceed := make(chan struct{})
		var runs atomic.Int64
		h := HandlerFunc(func(context.Context, *kgo.Record) error {
			runs.Add(1)
			<-proceed
			return nil
		})
		// Records of 257 bytes as MaxBufferedBytes counts them: 1 KiB
		// admits four.
		s := newBareShare(t, cl, h, Concurrency(1), MaxBufferedBytes(1<<10))
		stop := startWorkers(s)
		defer stop()
		s.admit(fetchesOfKey("k", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9))
		synctest.Wait()
		e := s.e
		e.mu.Lock()
		admitted, over := e.buf.Bytes(), e.parts[tp{topic: "t"}].over.Len()
		e.mu.Unlock()
		if st := s.snapshot(); admitted != 4*257 || over != 6 || st.Acquired != 10 {
			t.Fatalf("%d bytes admitted, %d records waiting, stats %+v; want 4 records admitted (1028 bytes), 6 waiting, 10 acquired", admitted, over, st)
		}
		e.withdrawAll()
		synctest.Wait()
		if st := s.snapshot(); st.Released != 9 || st.Acquired != 1 {
			t.Fatalf("stats %+v: want the 9 records not started released, the running one held", st)
		}
		close(proceed)
		synctest.Wait()
		if st := s.snapshot(); st.Accepted != 1 || st.Acquired != 0 || runs.Load() != 1 {
			t.Fatalf("%d runs, stats %+v: want the running record accepted, nothing else run", runs.Load(), st)
		}
	})
}
