package deadletter

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// sinkCase is one sink under the shared behavioural suite.
type sinkCase struct {
	name string
	// open returns a new, empty sink and the URL of the Source that reads
	// what it writes.
	open func(t *testing.T, ctx context.Context) (Sink, string)
}

func sinkCases() []sinkCase {
	return []sinkCase{
		{
			name: "kafka",
			open: func(t *testing.T, ctx context.Context) (Sink, string) {
				c := newCluster(t, kfake.SeedTopics(4, "orders.dlq"))
				return NewKafkaSink(newClient(t, c)), kafkaURL(c, "orders.dlq")
			},
		},
		{
			name: "file",
			open: func(t *testing.T, ctx context.Context) (Sink, string) {
				path := filepath.Join(t.TempDir(), "dlq.jsonl")
				s, err := NewFileSink(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s, "file://" + path
			},
		},
	}
}

// TestSinkSuite runs one behavioural suite against every sink: what Write
// stores, the matching Source reads back byte-for-byte.
func TestSinkSuite(t *testing.T) {
	for _, sc := range sinkCases() {
		t.Run(sc.name, func(t *testing.T) {
			t.Run("RoundTrip", func(t *testing.T) {
				ctx := testCtx(t)
				sink, url := sc.open(t, ctx)
				want := sampleLetters("orders")
				if err := sink.Write(ctx, want); err != nil {
					t.Fatalf("Write: %v", err)
				}
				src, err := OpenSource(ctx, url)
				if err != nil {
					t.Fatalf("OpenSource: %v", err)
				}
				checkSameLetters(t, want, readAll(t, ctx, src))
			})

			t.Run("WriteTwiceReadsOnce", func(t *testing.T) {
				ctx := testCtx(t)
				sink, url := sc.open(t, ctx)
				want := sampleLetters("orders")
				for i := range 2 {
					if err := sink.Write(ctx, want); err != nil {
						t.Fatalf("Write %d: %v", i, err)
					}
				}
				// A retried batch that overlaps the first.
				if err := sink.Write(ctx, want[1:3]); err != nil {
					t.Fatalf("Write overlap: %v", err)
				}
				src, err := OpenSource(ctx, url)
				if err != nil {
					t.Fatalf("OpenSource: %v", err)
				}
				checkSameLetters(t, want, readAll(t, ctx, src))
			})

			t.Run("FirstCopyWins", func(t *testing.T) {
				ctx := testCtx(t)
				sink, url := sc.open(t, ctx)
				l := sampleLetters("orders")[0]
				again := l
				again.Message, again.Attempts = "a later failure", 9
				for _, b := range [][]Letter{{l}, {again}} {
					if err := sink.Write(ctx, b); err != nil {
						t.Fatalf("Write: %v", err)
					}
				}
				src, err := OpenSource(ctx, url)
				if err != nil {
					t.Fatalf("OpenSource: %v", err)
				}
				checkSameLetters(t, []Letter{l}, readAll(t, ctx, src))
			})

			t.Run("EveryGroupKeepsItsLetter", func(t *testing.T) {
				// Two groups consuming one topic dead-letter the same
				// records: both sets are stored and read back.
				ctx := testCtx(t)
				sink, url := sc.open(t, ctx)
				billing := sampleLetters("orders")
				var audit []Letter
				for _, l := range billing {
					l.Group, l.Message = "audit", "audit: "+l.Message
					audit = append(audit, l)
				}
				for _, b := range [][]Letter{billing, audit, billing[:2]} {
					if err := sink.Write(ctx, b); err != nil {
						t.Fatalf("Write: %v", err)
					}
				}
				src, err := OpenSource(ctx, url)
				if err != nil {
					t.Fatalf("OpenSource: %v", err)
				}
				checkSameLetters(t, append(billing, audit...), readAll(t, ctx, src))
			})

			t.Run("EmptyBatch", func(t *testing.T) {
				ctx := testCtx(t)
				sink, url := sc.open(t, ctx)
				if err := sink.Write(ctx, nil); err != nil {
					t.Fatalf("Write(nil): %v", err)
				}
				src, err := OpenSource(ctx, url)
				if err != nil {
					t.Fatalf("OpenSource: %v", err)
				}
				if got := readAll(t, ctx, src); len(got) != 0 {
					t.Fatalf("read %d letters from an empty sink", len(got))
				}
			})

			t.Run("ConcurrentWrites", func(t *testing.T) {
				ctx := testCtx(t)
				sink, url := sc.open(t, ctx)
				var want []Letter
				var batches [][]Letter
				for w := range 4 {
					var b []Letter
					for i := range 25 {
						b = append(b, Letter{
							Record: &kgo.Record{Topic: "orders", Partition: int32(w), Offset: int64(i),
								Key: []byte(fmt.Sprint(i)), Value: []byte("v"), Timestamp: ms("2024-01-01T00:00:00Z")},
							Group: "g", Class: ClassExhausted, Message: "m", Attempts: 2, LastFailure: ms("2024-01-01T00:00:01Z"),
						})
					}
					batches = append(batches, b)
					want = append(want, b...)
				}
				var wg sync.WaitGroup
				errs := make(chan error, len(batches))
				for _, b := range batches {
					wg.Go(func() {
						// In small pieces, so the writers interleave.
						for i := 0; i < len(b); i += 5 {
							if err := sink.Write(ctx, b[i:i+5]); err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("Write: %v", err)
				}
				src, err := OpenSource(ctx, url)
				if err != nil {
					t.Fatalf("OpenSource: %v", err)
				}
				checkSameLetters(t, want, readAll(t, ctx, src))
			})

			t.Run("SourceReadsAgain", func(t *testing.T) {
				ctx := testCtx(t)
				sink, url := sc.open(t, ctx)
				want := sampleLetters("orders")
				if err := sink.Write(ctx, want); err != nil {
					t.Fatalf("Write: %v", err)
				}
				src, err := OpenSource(ctx, url)
				if err != nil {
					t.Fatalf("OpenSource: %v", err)
				}
				readAll(t, ctx, src)
				checkSameLetters(t, want, readAll(t, ctx, src))
			})

			t.Run("ReadStopsOnCallbackError", func(t *testing.T) {
				ctx := testCtx(t)
				sink, url := sc.open(t, ctx)
				if err := sink.Write(ctx, sampleLetters("orders")); err != nil {
					t.Fatalf("Write: %v", err)
				}
				src, err := OpenSource(ctx, url)
				if err != nil {
					t.Fatalf("OpenSource: %v", err)
				}
				stop := fmt.Errorf("enough")
				n := 0
				err = src.Read(ctx, func(Letter) error {
					n++
					return stop
				})
				if err != stop || n != 1 {
					t.Fatalf("Read returned %v after %d calls, want the callback's error after 1", err, n)
				}
			})
		})
	}
}
