package kpar

import (
	"context"
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
	produceSized(t, c.ListenAddrs(), "shbytes", n, size)
	h := newBytesInFlight(n)
	_, stop := runShare(t, c, "shbytes", h, Ordering(Unordered), Concurrency(256), MaxBufferedBytes(bound))
	waitFor(t, h.done, 60*time.Second, "every record handled")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	one := int64(size) + recordOverhead
	if h.most > bound+one {
		t.Errorf("%d records (%d bytes) handled at once with MaxBufferedBytes %d, want at most %d bytes (the bound plus one record)",
			h.mostRecords, h.most, bound, bound+one)
	}
	t.Logf("at most %d records (%d bytes) handled at once", h.mostRecords, h.most)
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
