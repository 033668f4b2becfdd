package kpar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/internal/progress"
)

// backfillOpts are the options every backfill test shares: fast retries
// and progress saves.
func backfillOpts(c *kfake.Cluster, extra ...BackfillOpt) []BackfillOpt {
	logger := testLogger()
	return append([]BackfillOpt{
		WithLogger(logger),
		Brokers(c.ListenAddrs()...),
		RetryBackoff(time.Millisecond, 5*time.Millisecond),
		ProgressInterval(20 * time.Millisecond),
		ShutdownTimeout(10 * time.Second),
	}, extra...)
}

// offsetCounts counts successful handlings per offset of one partition.
type offsetCounts []atomic.Int32

func (o offsetCounts) handler() HandlerFunc {
	return func(_ context.Context, r *kgo.Record) error {
		o[r.Offset].Add(1)
		return nil
	}
}

// check fails t unless every offset of [from, to) was handled at least
// once and none outside it; it returns the repeats.
func (o offsetCounts) check(t *testing.T, from, to int64) (repeats int) {
	t.Helper()
	var missing, outside []int64
	for off := range o {
		n := int(o[off].Load())
		in := int64(off) >= from && int64(off) < to
		switch {
		case in && n == 0:
			missing = append(missing, int64(off))
		case !in && n > 0:
			outside = append(outside, int64(off))
		case n > 1:
			repeats += n - 1
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d offsets of [%d, %d) never handled, first %d", len(missing), from, to, missing[0])
	}
	if len(outside) > 0 {
		t.Errorf("%d offsets outside [%d, %d) handled, first %d", len(outside), from, to, outside[0])
	}
	return repeats
}

func TestBackfillDeliversExactlyTheRange(t *testing.T) {
	c := newFakeCluster(t, notPorted, "bf", 1)
	produce(t, c, "bf", 20_000, 100)
	counts := make(offsetCounts, 20_000)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := Backfill(ctx, counts.handler(), Range{Topic: "bf", From: AtOffset(5_000), To: AtOffset(15_000)},
		backfillOpts(c, Readers(4), Concurrency(16))...)
	if err != nil {
		t.Fatal(err)
	}
	if repeats := counts.check(t, 5_000, 15_000); repeats != 0 {
		t.Errorf("%d repeats in one uninterrupted run; want 0", repeats)
	}
	if res.Records != 10_000 || res.Failed != 0 || res.DeadLettered != 0 || res.Slices != 4 {
		t.Errorf("result = %+v; want 10000 records, 0 failed, 0 dead-lettered, 4 slices", res)
	}
}

func TestBackfillResumesAfterCancelLosingNothing(t *testing.T) {
	c := newFakeCluster(t, notPorted, "bf", 1)
	// Batches of at most 4 KiB (about 100 records), and fetches of one
	// batch: a produce with the default batch size may make batches of
	// thousands, and a reader's first fetch its whole slice, which the
	// drain after the cancel then finishes.
	pcl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerBatchMaxBytes(4<<10), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 20_000 {
		recs = append(recs, &kgo.Record{Topic: "bf", Key: fmt.Appendf(nil, "key-%d", i%100), Value: encodeValue(i%100, i/100)})
	}
	err = pcl.ProduceSync(t.Context(), recs...).FirstErr()
	pcl.Close()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "progress.json")
	r := Range{Topic: "bf", From: AtOffset(5_000), To: AtOffset(15_000)}
	counts := make(offsetCounts, 20_000)

	// Cancel the first run at a random record, and note how many records
	// were in flight then: a resumed run may repeat those, nothing else.
	stopAt := 1_000 + rand.Int64N(3_000)
	var (
		handled, running atomic.Int64
		inFlightAtCancel atomic.Int64
	)
	inFlightAtCancel.Store(-1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, rec *kgo.Record) error {
		running.Add(1)
		defer running.Add(-1)
		if handled.Add(1) == stopAt {
			inFlightAtCancel.Store(running.Load())
			cancel()
		}
		counts[rec.Offset].Add(1)
		return nil
	})
	// The drain after the cancel finishes what the readers had delivered:
	// per slice a window, the records held outside it (at most 8
	// windows, see heldCap) and one fetch, 4 x (9 x 128 + 100) on top of
	// fewer than 4,000 handled stays below the range's 10,000, so the
	// first run never finishes it.
	first, err := Backfill(ctx, h, r, backfillOpts(c, Readers(4), Concurrency(16), WindowRecords(128), ProgressFile(file),
		ClientOptions(kgo.FetchMaxPartitionBytes(1)))...)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run returned %v; want an error wrapping context.Canceled", err)
	}
	if first.Records >= 10_000 {
		t.Fatalf("cancelled run finished all %d records; the test cancels too late", first.Records)
	}

	second, err := Backfill(t.Context(), counts.handler(), r, backfillOpts(c, Readers(4), Concurrency(16), ProgressFile(file))...)
	if err != nil {
		t.Fatal(err)
	}
	repeats := counts.check(t, 5_000, 15_000)
	if max := inFlightAtCancel.Load(); int64(repeats) > max {
		t.Errorf("%d records repeated after the cancel; want at most the %d in flight then", repeats, max)
	}
	if second.AlreadyDone+second.Records < 10_000 || second.AlreadyDone < first.Records-int64(repeats) {
		t.Errorf("resumed run: %+v after a first run of %d records; want it to skip what the first finished", second, first.Records)
	}
	t.Logf("cancelled after %d records (%d in flight), resumed with %d done; %d repeats", first.Records, inFlightAtCancel.Load(), second.AlreadyDone, repeats)

	third, err := Backfill(t.Context(), counts.handler(), r, backfillOpts(c, Readers(4), ProgressFile(file))...)
	if err != nil || third.Records != 0 || third.AlreadyDone != 10_000 {
		t.Errorf("third run on a finished file = %+v, %v; want nothing to do", third, err)
	}
}

func TestBackfillRejectsBadRanges(t *testing.T) {
	c := newFakeCluster(t, notPorted, "bf", 2)
	produce(t, c, "bf", 200, 2) // 100 per partition
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var del kadm.Offsets
	del.Add(kadm.Offset{Topic: "bf", Partition: 1, At: 10})
	if _, err := kadm.NewClient(cl).DeleteRecords(t.Context(), del); err != nil {
		t.Fatal(err)
	}
	otherFile := filepath.Join(t.TempDir(), "other.json")
	if err := progress.Save(otherFile, &progress.State{
		Range:  progress.Range{Topic: "other", From: "0", To: "10"},
		Slices: []progress.Slice{{Partition: 0, From: 0, To: 10, Done: 5}},
	}); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name string
		r    Range
		opts []BackfillOpt
		want string
	}{
		{"from not below to", Range{Topic: "bf", From: AtOffset(50), To: AtOffset(50)}, nil, "from offset 50 is not below to offset 50"},
		{"below log start", Range{Topic: "bf", Partitions: []int32{1}, From: AtOffset(5), To: AtOffset(50)}, nil, "partition 1: from offset 5 is below the log start 10"},
		{"above high watermark", Range{Topic: "bf", From: AtOffset(0), To: AtOffset(101)}, nil, "to offset 101 is above the high watermark 100"},
		{"unknown topic", Range{Topic: "nope", From: AtOffset(0), To: AtOffset(1)}, nil, `topic "nope": unknown topic`},
		{"unknown partition", Range{Topic: "bf", Partitions: []int32{0, 7}, From: AtOffset(0), To: AtOffset(1)}, nil, "unknown partition 7"},
		{"time after every record", Range{Topic: "bf", From: AtTime(future), To: AtTime(future.Add(time.Hour))}, nil, "resolves to no offset"},
		{"times reversed", Range{Topic: "bf", From: AtTime(future), To: AtTime(future.Add(-time.Hour))}, nil, "is not before to time"},
		{"progress of another range", Range{Topic: "bf", From: AtOffset(0), To: AtOffset(10)}, []BackfillOpt{ProgressFile(otherFile)}, "holds the progress of topic \"other\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var handled atomic.Int64
			_, err := Backfill(t.Context(), HandlerFunc(func(context.Context, *kgo.Record) error { handled.Add(1); return nil }),
				tc.r, backfillOpts(c, tc.opts...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Backfill = %v; want an error containing %q", err, tc.want)
			}
			if !errors.Is(err, ErrBadRange) && !errors.Is(err, ErrProgressMismatch) {
				t.Errorf("error %v wraps neither ErrBadRange nor ErrProgressMismatch", err)
			}
			if handled.Load() != 0 {
				t.Errorf("%d records handled for a bad range", handled.Load())
			}
		})
	}
}

func TestBackfillDeadLettersFailingRecordsToAFileSink(t *testing.T) {
	c := newFakeCluster(t, notPorted, "bf", 1)
	produce(t, c, "bf", 1_000, 10)
	path := filepath.Join(t.TempDir(), "dlq.jsonl")
	sink, err := deadletter.NewFileSink(path)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	// Offsets 3, 13, ... are rejected at once; 9, 34, ... fail every attempt;
	// 5, 15, ... fail once and then succeed.
	var attempts [1_000]atomic.Int32
	h := HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		n := attempts[r.Offset].Add(1)
		switch {
		case r.Offset%10 == 3:
			return Permanent(errors.New("rejected"))
		case r.Offset%25 == 9:
			return errors.New("always failing")
		case r.Offset%10 == 5 && n == 1:
			panic("first attempt panics")
		}
		return nil
	})
	res, err := Backfill(t.Context(), h, Range{Topic: "bf", From: AtOffset(100), To: AtOffset(600)},
		backfillOpts(c, Readers(2), MaxAttempts(3), DeadLetters(sink))...)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]deadletter.Class{}
	for off := int64(100); off < 600; off++ {
		switch {
		case off%10 == 3:
			want[off] = deadletter.ClassPermanent
		case off%25 == 9:
			want[off] = deadletter.ClassExhausted
		}
	}
	src, err := deadletter.OpenSource(t.Context(), "file://"+path)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]deadletter.Class{}
	err = src.Read(t.Context(), func(l deadletter.Letter) error {
		got[l.Record.Offset] = l.Class
		if l.Class == deadletter.ClassExhausted && l.Attempts != 3 {
			t.Errorf("offset %d: %d attempts in the dead letter; want 3", l.Record.Offset, l.Attempts)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("%d dead letters; want %d", len(got), len(want))
	}
	for off, class := range want {
		if got[off] != class {
			t.Errorf("offset %d: dead-lettered as %q; want %q", off, got[off], class)
		}
	}
	failedOnce := int64(0)
	for off := int64(100); off < 600; off++ {
		if off%10 == 5 && off%25 != 9 {
			failedOnce++
		}
	}
	if res.Records != 500 || res.DeadLettered != int64(len(want)) || res.Failed != int64(len(want))+failedOnce {
		t.Errorf("result = %+v; want 500 records, %d dead-lettered, %d failed", res, len(want), int64(len(want))+failedOnce)
	}
}

func TestBackfillTimeRange(t *testing.T) {
	c := newFakeCluster(t, notPorted, "bf", 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("bf"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var rs []*kgo.Record
	for i := range 100 {
		rs = append(rs, &kgo.Record{Value: []byte("x"), Timestamp: base.Add(time.Duration(i) * time.Minute)})
	}
	if err := cl.ProduceSync(t.Context(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	counts := make(offsetCounts, 100)
	// From minute 10 (inclusive) to minute 30 (exclusive), and from an
	// offset to a time after every record: up to the high watermark.
	for _, tc := range []struct {
		r        Range
		from, to int64
	}{
		{Range{Topic: "bf", From: AtTime(base.Add(10 * time.Minute)), To: AtTime(base.Add(30 * time.Minute))}, 10, 30},
		{Range{Topic: "bf", From: AtOffset(90), To: AtTime(base.Add(time.Hour * 24))}, 90, 100},
	} {
		for i := range counts {
			counts[i].Store(0)
		}
		if _, err := Backfill(t.Context(), counts.handler(), tc.r, backfillOpts(c, Readers(3))...); err != nil {
			t.Fatal(err)
		}
		counts.check(t, tc.from, tc.to)
	}
}

// A range ending at the high watermark behind a transaction marker ends:
// the marker's offset is never delivered as a record, and the reader does
// not wait for it.
func TestBackfillEndsAtATransactionMarker(t *testing.T) {
	c := newFakeCluster(t, notPorted, "bf", 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("bf"), kgo.TransactionalID("bf-txn"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		cl.Produce(t.Context(), &kgo.Record{Value: []byte("x")}, nil)
	}
	if err := cl.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(t.Context(), kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	ends, err := kadm.NewClient(cl).ListEndOffsets(t.Context(), "bf")
	if err != nil {
		t.Fatal(err)
	}
	hwm := ends["bf"][0].Offset
	if hwm != 51 {
		t.Fatalf("high watermark %d; want 51 (50 records and a commit marker)", hwm)
	}
	counts := make(offsetCounts, hwm)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := Backfill(ctx, counts.handler(), Range{Topic: "bf", From: AtOffset(0), To: AtOffset(hwm)}, backfillOpts(c, Readers(2))...)
	if err != nil {
		t.Fatal(err)
	}
	counts.check(t, 0, 50)
	if res.Records != 50 {
		t.Errorf("%d records; want 50 (the marker is not a record)", res.Records)
	}
}

// Progress is saved as soon as it moved, then at most once per
// ProgressInterval, and once more at the end.
func TestBackfillSavesProgressAtMostOncePerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "p.json")
		state := &progress.State{
			Range:  progress.Range{Topic: "t", From: "0", To: "100"},
			Slices: []progress.Slice{{Partition: 0, From: 0, To: 100}},
		}
		var r *rangeSource
		e := testEngineWithSource(func(c *cfg) { c.progressInterval = time.Second }, func(e *engine) source {
			r = newRangeSource(e, "t", file, state)
			return r
		})
		ps := r.slices[0].ps
		e.parts[ps.tp] = ps
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { e.settler(ctx); close(done) }()

		saved := func() int64 {
			s, err := progress.Load(file)
			if err != nil || s == nil {
				return -1
			}
			return s.Slices[0].Done
		}
		finishNext := func(off int64) {
			e.mu.Lock()
			ps.win.Done(ps.win.Push(off))
			e.askCommit()
			e.mu.Unlock()
			synctest.Wait()
		}
		finishNext(0)
		if got := saved(); got != 1 {
			t.Fatalf("after the first record: saved %d; want 1 at once", got)
		}
		for off := int64(1); off < 10; off++ {
			time.Sleep(100 * time.Millisecond)
			finishNext(off)
			if got := saved(); got != 1 {
				t.Fatalf("after %d00ms: saved %d; want still 1 within the interval", off, got)
			}
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if got := saved(); got != 10 {
			t.Fatalf("one interval after the first save: saved %d; want 10", got)
		}
		finishNext(10)
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if got := saved(); got != 10 {
			t.Fatalf("half an interval later: saved %d; want still 10", got)
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if got := saved(); got != 11 {
			t.Fatalf("one interval later: saved %d; want 11", got)
		}
		cancel()
		<-done
	})
}

// BenchmarkBackfill reads a 20,000-record one-partition topic with 1, 2 and
// 4 readers, with a handler that does nothing and one that takes 5 ms
// (Concurrency 64: the 5 ms case is bound by workers, not readers).
func BenchmarkBackfill(b *testing.B) {
	const records = 20_000
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	produce(b, c, "bench", records, 100)
	for _, h := range []struct {
		name string
		n    int64 // records per iteration
		fn   HandlerFunc
	}{
		{"noop", records, func(context.Context, *kgo.Record) error { return nil }},
		{"5ms", 4_000, func(context.Context, *kgo.Record) error { time.Sleep(5 * time.Millisecond); return nil }},
	} {
		for _, readers := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("%s/readers-%d", h.name, readers), func(b *testing.B) {
				b.ReportAllocs()
				r := Range{Topic: "bench", From: AtOffset(0), To: AtOffset(h.n)}
				for b.Loop() {
					res, err := Backfill(b.Context(), h.fn, r, WithLogger(slog.New(slog.DiscardHandler)),
						Brokers(c.ListenAddrs()...), Readers(readers))
					if err != nil || res.Records != h.n {
						b.Fatalf("Backfill = %+v, %v", res, err)
					}
				}
				b.ReportMetric(float64(h.n*int64(b.N))/b.Elapsed().Seconds(), "records/s")
			})
		}
	}
}
