package forward

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// benchRecord is a typical record: a short key, a 1 KiB value, two headers.
func benchRecord() *kgo.Record {
	return &kgo.Record{
		Topic: "orders", Partition: 3, Offset: 123456, Timestamp: time.Now(),
		Key: []byte("customer-42"), Value: bytes.Repeat([]byte{'x'}, 1024),
		Headers: []kgo.RecordHeader{
			{Key: "source", Value: []byte("checkout")},
			{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
		},
	}
}

// benchEndpoint reads each request's body and answers 200 with an empty
// body after serviceTime (0: at once).
func benchEndpoint(b *testing.B, serviceTime time.Duration) *httptest.Server {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if serviceTime > 0 {
			time.Sleep(serviceTime) // the endpoint's own work
		}
	}))
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkForwardPerRecord measures the cost of forwarding one record
// (request building, the round trip on a kept-alive connection, reading the
// answer) against a local endpoint that answers at once.
func BenchmarkForwardPerRecord(b *testing.B) {
	srv := benchEndpoint(b, 0)
	h, err := New(srv.URL, Concurrency(8), Timeout(attemptTimeout))
	if err != nil {
		b.Fatal(err)
	}
	defer h.CloseIdleConnections()
	r := benchRecord()
	b.ReportAllocs()
	b.SetParallelism(4)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := handleAttempt(h, r); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
}

// runConcurrently calls fn total times from conc goroutines, as kpar's
// worker pool would, and returns the time it took.
func runConcurrently(b *testing.B, conc, total int, fn func() error) time.Duration {
	b.Helper()
	var left atomic.Int64
	left.Store(int64(total))
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := fn(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// loadGenerator is the plain Go HTTP client a user would write: conc
// goroutines POSTing the value with a pooled client, draining each answer.
func loadGenerator(b *testing.B, url string, conc, total int, body []byte) time.Duration {
	b.Helper()
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = conc, conc
	cl := &http.Client{Transport: t}
	defer cl.CloseIdleConnections()
	return runConcurrently(b, conc, total, func() error {
		resp, err := cl.Post(url, "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	})
}

// forwardRecords runs total records through h from conc goroutines, each
// call with a context of its own with a deadline, as kpar's attempts have.
func forwardRecords(b *testing.B, h *Handler, conc, total int, r *kgo.Record) time.Duration {
	b.Helper()
	return runConcurrently(b, conc, total, func() error { return handleAttempt(h, r) })
}

// handleAttempt is one kpar attempt: a context with the attempt deadline
// (10s, kpar forward's default --attempt-timeout) around Handle.
func handleAttempt(h *Handler, r *kgo.Record) error {
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	return h.Handle(ctx, r)
}

// attemptTimeout is what kpar forward gives both kpar.AttemptTimeout and
// forward.Timeout by default.
const attemptTimeout = 10 * time.Second

// BenchmarkForwardVsLoadGenerator forwards records to an endpoint that
// takes 5ms per request (the figures of issue 10), and in the same run
// sends requests with a plain load generator at concurrency 256. Per
// record, the Handler runs at the same concurrency; with batches of 100,
// at 800, what `kpar forward --batch 100` runs by default (8 batches in
// flight: 256 would leave 2). It reports both rates and their ratio, forwarded records/s
// over generator requests/s: per record, 1 means no overhead; with
// batch-100, how many more records a second batching moves. The two
// alternate, a quarter of the records each time, so that drift hits both alike.
func BenchmarkForwardVsLoadGenerator(b *testing.B) {
	const service = 5 * time.Millisecond
	const genConc = 256
	for _, tc := range []struct {
		name        string
		batch, conc int
	}{
		{"per-record", 1, genConc},
		{"batch-100", 100, 800},
	} {
		conc := tc.conc
		b.Run(tc.name, func(b *testing.B) {
			srv := benchEndpoint(b, service)
			opts := []Opt{Concurrency(conc), Timeout(attemptTimeout)}
			if tc.batch > 1 {
				opts = append(opts, Batch(tc.batch, 5*time.Millisecond))
			}
			h, err := New(srv.URL, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer h.CloseIdleConnections()
			r := benchRecord()
			n := max(b.N, 4*conc)
			var gen, fwd time.Duration
			b.ReportAllocs()
			for range 4 {
				gen += loadGenerator(b, srv.URL, genConc, n/4, r.Value)
				fwd += forwardRecords(b, h, conc, n/4, r)
			}
			genRate, fwdRate := float64(n)/gen.Seconds(), float64(n)/fwd.Seconds()
			b.ReportMetric(genRate, "generator-req/s")
			b.ReportMetric(fwdRate, "records/s")
			b.ReportMetric(fwdRate/genRate, "ratio")
		})
	}
}
