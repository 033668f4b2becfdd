package window

import "testing"

// BenchmarkWindowPushDone pushes one offset and finishes it straight away, the
// in-order case (one worker, or a key-ordered partition).
func BenchmarkWindowPushDone(b *testing.B) {
	w := New(64)
	b.ReportAllocs()
	var offset int64
	for b.Loop() {
		s := w.Push(offset)
		w.Done(s)
		w.Start()
		offset++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkWindowOutOfOrder keeps 256 records in flight and finishes a random
// one per op, as a pool of workers with uneven latencies would.
func BenchmarkWindowOutOfOrder(b *testing.B) {
	const inFlight = 256
	w := New(4096)
	var slots [inFlight]Seq
	var offset int64
	for i := range slots {
		slots[i] = w.Push(offset)
		offset++
	}
	rnd := uint64(0x9e3779b97f4a7c15)
	b.ReportAllocs()
	for b.Loop() {
		rnd ^= rnd << 13
		rnd ^= rnd >> 7
		rnd ^= rnd << 17
		i := rnd % inFlight
		w.Done(slots[i])
		slots[i] = w.Push(offset)
		w.Start()
		offset++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
