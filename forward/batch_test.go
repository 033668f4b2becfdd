package forward

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// batchServer decodes every batch and answers with answer(batch).
func batchServer(t *testing.T, answer func(w http.ResponseWriter, batch []BatchRecord)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var batch []BatchRecord
		body, _ := io.ReadAll(r.Body)
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			http.Error(w, "content type "+ct, http.StatusUnsupportedMediaType)
			return
		}
		if err := json.Unmarshal(body, &batch); err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		answer(w, batch)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// handleAll calls h.Handle for every record at once and returns the
// errors in record order.
func handleAll(h *Handler, rs []*kgo.Record) []error {
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() { errs[i] = h.Handle(context.Background(), r) })
	}
	wg.Wait()
	return errs
}

func TestForwardBatchBodyCarriesEveryRecord(t *testing.T) {
	got := make(chan []BatchRecord, 1)
	srv := batchServer(t, func(w http.ResponseWriter, b []BatchRecord) { got <- b })
	// An hour's wait: only a full batch can be sent.
	h := newHandler(t, srv.URL, Batch(2, time.Hour))
	ts := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	rs := []*kgo.Record{
		{Topic: "orders", Partition: 1, Offset: 7, Timestamp: ts, Key: []byte("k"), Value: []byte("v"),
			Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("1")}, {Key: "H", Value: []byte("2")}, {Key: "h", Value: []byte("3")}}},
		{Topic: "orders", Partition: 2, Offset: 9, Timestamp: ts}, // nil key, nil value
	}
	for i, err := range handleAll(h, rs) {
		if err != nil {
			t.Errorf("record %d: %v", i, err)
		}
	}
	b := <-got
	if len(b) != 2 {
		t.Fatalf("batch of %d, want 2", len(b))
	}
	if b[0].Partition == 2 { // the order of concurrent callers is theirs
		b[0], b[1] = b[1], b[0]
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	r0, r1 := b[0], b[1]
	if r0.Topic != "orders" || r0.Partition != 1 || r0.Offset != 7 || !r0.Timestamp.Equal(ts.Truncate(time.Millisecond)) ||
		string(r0.Key) != "k" || string(r0.Value) != "v" {
		t.Errorf("first record %+v", r0)
	}
	if len(r0.Headers) != 2 || string(r0.Headers["h"]) != "3" || string(r0.Headers["H"]) != "2" {
		t.Errorf("headers %q, want h (last value) and H", r0.Headers)
	}
	wantList := [][2]string{{"h", b64("1")}, {"H", b64("2")}, {"h", b64("3")}}
	if fmt.Sprint(r0.HeaderList) != fmt.Sprint(wantList) {
		t.Errorf("header_list %v, want %v", r0.HeaderList, wantList)
	}
	if r1.Key != nil || r1.Value != nil || len(r1.Headers) != 0 || len(r1.HeaderList) != 0 {
		t.Errorf("second record %+v, want null key and value (a tombstone) and no headers", r1)
	}
}

// An empty value is "" and decodes to an empty, non-nil slice: not a
// tombstone.
func TestForwardBatchEmptyValueIsNotATombstone(t *testing.T) {
	got := make(chan []BatchRecord, 1)
	srv := batchServer(t, func(w http.ResponseWriter, b []BatchRecord) { got <- b })
	h := newHandler(t, srv.URL, Batch(2, time.Millisecond))
	if err := h.Handle(t.Context(), &kgo.Record{Topic: "t", Key: []byte{}, Value: []byte{}}); err != nil {
		t.Fatal(err)
	}
	if r := (<-got)[0]; r.Key == nil || r.Value == nil || len(r.Value) != 0 {
		t.Errorf("key %v, value %v: want both empty and non-nil", r.Key, r.Value)
	}
}

func TestForwardBatchPerRecordStatuses(t *testing.T) {
	srv := batchServer(t, func(w http.ResponseWriter, b []BatchRecord) {
		statuses := make([]int, len(b))
		for i, r := range b {
			statuses[i] = []int{200, 500, 400, 429, 204}[r.Offset]
		}
		json.NewEncoder(w).Encode(statuses)
	})
	h := newHandler(t, srv.URL, Batch(5, time.Hour))
	var rs []*kgo.Record
	for i := range 5 {
		rs = append(rs, &kgo.Record{Topic: "t", Offset: int64(i)})
	}
	errs := handleAll(h, rs)
	var serr *StatusError
	switch {
	case errs[0] != nil || errs[4] != nil:
		t.Errorf("2xx records: %v, %v; want nil", errs[0], errs[4])
	case errs[1] == nil || kpar.IsPermanent(errs[1]) || !errors.As(errs[1], &serr) || serr.StatusCode != 500 || serr.Batch != 5:
		t.Errorf("500 record: %v, want a retryable StatusError 500 in a batch of 5", errs[1])
	case !kpar.IsPermanent(errs[2]):
		t.Errorf("400 record: %v, want permanent", errs[2])
	case errs[3] == nil || kpar.IsPermanent(errs[3]):
		t.Errorf("429 record: %v, want retryable", errs[3])
	}
}

func TestForwardBatchAnswerForTheWholeRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		status    int
		body      string
		ok        bool
		permanent bool
	}{
		{"empty 2xx", 200, "", true, false},
		{"blank 2xx", 202, " \n", true, false},
		{"503", 503, "", false, false},
		{"400", 400, "bad", false, true},
		{"not an array", 200, `{"ok":true}`, false, false},
		{"wrong length", 200, `[200]`, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := batchServer(t, func(w http.ResponseWriter, b []BatchRecord) {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			})
			h := newHandler(t, srv.URL, Batch(3, time.Hour))
			rs := []*kgo.Record{{Topic: "t"}, {Topic: "t"}, {Topic: "t"}}
			for i, err := range handleAll(h, rs) {
				if (err == nil) != tc.ok || kpar.IsPermanent(err) != tc.permanent {
					t.Errorf("record %d: %v, want ok %v, permanent %v", i, err, tc.ok, tc.permanent)
				}
			}
		})
	}
}

// A batch that does not fill goes out after the wait.
func TestForwardBatchIsSentAfterTheWait(t *testing.T) {
	sizes := make(chan int, 1)
	srv := batchServer(t, func(w http.ResponseWriter, b []BatchRecord) { sizes <- len(b) })
	h := newHandler(t, srv.URL, Batch(100, time.Millisecond))
	if err := h.Handle(t.Context(), &kgo.Record{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	if n := <-sizes; n != 1 {
		t.Errorf("batch of %d, want 1", n)
	}
}

// The trace context of a batch's records goes on as its request's.
func TestForwardBatchCarriesTraceContext(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Get("Traceparent") }))
	defer srv.Close()
	h := newHandler(t, srv.URL, Batch(2, time.Hour))
	handleAll(h, []*kgo.Record{{Topic: "t"}, {Topic: "t", Headers: []kgo.RecordHeader{{Key: TraceParent, Value: []byte(tp)}}}})
	if g := <-got; g != tp {
		t.Errorf("traceparent %q, want %q", g, tp)
	}
}

// TestForwardBatchesKeepKparOrdering runs the batching handler under the
// kpar engine against kfake and checks the claim the batcher rests on:
// since kpar hands out at most one record per key and partition (Key mode)
// or per partition (Partition mode) at a time, no batch holds two records
// whose order matters, and each key's (partition's) records are delivered
// in offset order, first attempts failing now and then included.
func TestForwardBatchesKeepKparOrdering(t *testing.T) {
	for _, mode := range []kpar.Order{kpar.ByKey, kpar.ByPartition} {
		t.Run(mode.String(), func(t *testing.T) { testBatchOrdering(t, mode) })
	}
}

func testBatchOrdering(t *testing.T, mode kpar.Order) {
	const topic, partitions, keys, n = "events", 4, 24, 1200
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	produceKeyed(ctx, t, c.ListenAddrs(), topic, n, keys)

	type orderKey struct {
		partition int32
		key       string
	}
	lane := func(r BatchRecord) orderKey {
		if mode == kpar.ByPartition {
			return orderKey{partition: r.Partition}
		}
		return orderKey{r.Partition, string(r.Key)}
	}
	var (
		mu       sync.Mutex
		last     = map[orderKey]int64{} // highest offset done per lane
		done     = map[[2]int64]bool{}  // partition, offset
		attempts = map[[2]int64]int{}
		largest  int
		problems []string
	)
	finished := make(chan struct{})
	srv := batchServer(t, func(w http.ResponseWriter, b []BatchRecord) {
		mu.Lock()
		defer mu.Unlock()
		largest = max(largest, len(b))
		seen := map[orderKey]bool{}
		statuses := make([]int, len(b))
		for i, r := range b {
			l := lane(r)
			if seen[l] {
				problems = append(problems, fmt.Sprintf("batch holds two records of %v", l))
			}
			seen[l] = true
			id := [2]int64{int64(r.Partition), r.Offset}
			attempts[id]++
			statuses[i] = 200
			if r.Offset%7 == 3 && attempts[id] == 1 {
				statuses[i] = 503 // retried; the lane's next record must wait
				continue
			}
			if done[id] {
				continue
			}
			if prev, ok := last[l]; ok && prev > r.Offset {
				problems = append(problems, fmt.Sprintf("%v: offset %d after %d", l, r.Offset, prev))
			}
			last[l] = r.Offset
			done[id] = true
			if len(done) == n {
				close(finished)
			}
		}
		json.NewEncoder(w).Encode(statuses)
	})
	h := newHandler(t, srv.URL, Batch(16, 2*time.Millisecond), Concurrency(64))
	cons, err := kpar.New(h,
		kpar.Brokers(c.ListenAddrs()...), kpar.Group("g"), kpar.Topics(topic),
		kpar.Ordering(mode), kpar.Concurrency(64), kpar.MaxAttempts(5),
		kpar.RetryBackoff(time.Millisecond, 5*time.Millisecond),
		kpar.WithLogger(slog.New(slog.DiscardHandler)),
		kpar.ClientOptions(kgo.FetchMaxWait(100*time.Millisecond)),
	)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- cons.Run(runCtx) }()
	select {
	case <-finished:
	case err := <-ran:
		t.Fatalf("Run returned early: %v", err)
	case <-ctx.Done():
		mu.Lock()
		t.Fatalf("%d of %d records delivered before the timeout", len(done), n)
	}
	stop()
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	if largest < 2 {
		t.Errorf("largest batch %d: the batcher never batched", largest)
	}
	t.Logf("%v mode: largest batch %d", mode, largest)
}

// produceKeyed writes n records with keys k00..k<keys-1> in turn.
func produceKeyed(ctx context.Context, t *testing.T, seeds []string, topic string, n, keys int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Key: fmt.Appendf(nil, "k%02d", i%keys), Value: fmt.Appendf(nil, "%d", i)}
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// A batch request ends once every member's context has: members wait for
// the answer (so kpar's order holds), but not past their own deadline.
func TestForwardBatchRequestEndsWithItsMembersContexts(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers
	}))
	defer srv.Close()
	h := newHandler(t, srv.URL, Batch(2, time.Hour))
	ctx1, cancel1 := context.WithCancel(t.Context())
	ctx2, cancel2 := context.WithCancel(t.Context())
	errs := make(chan error, 2)
	go func() { errs <- h.Handle(ctx1, &kgo.Record{Topic: "t"}) }()
	go func() { errs <- h.Handle(ctx2, &kgo.Record{Topic: "t"}) }()
	cancel1()
	select {
	case err := <-errs:
		t.Fatalf("a member returned (%v) while the other still waits for the answer", err)
	default:
	}
	cancel2()
	for range 2 {
		if err := <-errs; err == nil || kpar.IsPermanent(err) {
			t.Errorf("err %v, want a retryable error", err)
		}
	}
}
