package kpar

import (
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// fetchSizing is a group member's fetch sizes, derived from
// MaxBufferedBytes so that the client's fetched records, which wait for
// the budget to admit them, stay a fraction of it too: fetches of an
// eighth of it (at least 64 KiB, at most franz-go's 50 MiB), a partition's
// part of one fetchPartitionBytes (512 KiB at the default budget), and no
// more fetches in flight or buffered at once than make a quarter of it (at
// least one). A
// broker still returns a partition's first batch whatever its size, so a
// record larger than these is fetched all the same. ClientOptions override
// each. The sizes count the records as they are sent, compressed or not:
// fetchSizer shrinks them by the compression it sees.
func fetchSizing(maxBytes int64) (fetch, part int32, opts []kgo.Opt) {
	f := min(max(maxBytes/8, 64<<10), 50<<20)
	fetch, part = int32(f), min(int32(f), fetchPartitionBytes(maxBytes))
	return fetch, part, []kgo.Opt{
		kgo.FetchMaxBytes(fetch),
		kgo.FetchMaxPartitionBytes(part),
		kgo.MaxConcurrentFetches(int(max(1, maxBytes/4/f))),
	}
}

// fetchSizer keeps the fetches' records, once decompressed, near the sizes
// fetchSizing meant: a broker counts a fetch's bytes compressed, and 512
// KB values that compress twenty times made a fetch of 4 MiB bring 80 MiB
// of records, and the partitions' records waiting for the budget hundreds
// of MiB. Its hook counts every batch's bytes and records; adjust, by the
// poller after each poll, divides the client's fetch sizes by the ratio
// seen, but only for records of largeRecord or more on average: small
// records weigh what franz-go's per-record overhead weighs, which the
// ratio does not tell (fetchPartitionBytes bounds them), and dividing
// their fetches cost kpar bench noop (100-byte records) a fifth of its
// rate: 0.82-0.84x raw against 1.02-1.08x undivided, one sitting.
type fetchSizer struct {
	fetch, part  int32 // fetchSizing's, in decompressed bytes
	ratio        int64 // the divisor applied now; owned by the poller
	off          bool  // ClientOptions set the fetch sizes: leave them
	compressed   atomic.Int64
	uncompressed atomic.Int64
	records      atomic.Int64
}

// largeRecord is the average decompressed size from which fetchSizer
// divides the fetch sizes by the compression seen.
const largeRecord = 16 << 10

var _ kgo.HookFetchBatchRead = (*fetchSizer)(nil)

// OnFetchBatchRead counts a fetched batch's bytes.
func (f *fetchSizer) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	f.compressed.Add(int64(m.CompressedBytes))
	f.uncompressed.Add(int64(m.UncompressedBytes))
	f.records.Add(int64(m.NumRecords))
}

// maxRatio is the most compression fetchSizer divides by.
const maxRatio = 256

// start notes whether the client's fetch sizes are fetchSizing's (if
// ClientOptions set others, adjust leaves them). It divides nothing until
// a ratio is seen: starting at the most compression (tiny first fetches)
// cost kpar bench noop a tenth of its rate however soon adjust undid it,
// so the first fetch of well-compressed large records may bring up to its
// ratio times the fetch size, once.
func (f *fetchSizer) start(cl *kgo.Client) {
	f.off = cl.OptValue(kgo.FetchMaxBytes) != f.fetch || cl.OptValue(kgo.FetchMaxPartitionBytes) != f.part
	f.ratio = 1
}

// apply divides the client's fetch sizes by ratio.
func (f *fetchSizer) apply(cl *kgo.Client, ratio int64) {
	f.ratio = ratio
	cl.UpdateFetchMaxBytes(int32(max(int64(f.fetch)/ratio, 4<<10)), int32(max(int64(f.part)/ratio, 4<<10)))
}

// adjust divides the client's fetch sizes by the compression ratio of the
// batches read since it last judged one, once 64 KiB of them were read.
func (f *fetchSizer) adjust(cl *kgo.Client) {
	c := f.compressed.Load()
	if f.off || c < 64<<10 {
		return
	}
	u, n := f.uncompressed.Load(), f.records.Load()
	f.compressed.Add(-c)
	f.uncompressed.Add(-u)
	f.records.Add(-n)
	ratio := min(max(u/c, 1), maxRatio)
	if u < largeRecord*max(n, 1) {
		ratio = 1
	}
	if ratio != f.ratio {
		f.apply(cl, ratio)
	}
}

// fetchPartitionBytes is kpar's default kgo.FetchMaxPartitionBytes, from
// MaxBufferedBytes: a 128th of it, between 64 KiB and franz-go's default
// 1 MiB (512 KiB at the default 64 MiB).
//
// A fetch's wire bytes understate what it weighs once decoded: franz-go
// gives each record a 160-byte kgo.Record in a slab per batch, and the
// key and value alias the response body, which stays live while any of
// them is. A 16-byte record costs about 30 bytes on the wire and over 200
// decoded. kpar's poller takes the next fetch while workers still hold
// the last, and franz-go buffers one more meanwhile, so up to three
// decoded fetches are live where a plain poll loop mostly holds one.
// kpar bench memory (10^7 records of 16 bytes, 8 partitions; gctrace)
// found up to 80 MB marked live in kpar against 52 MB in raw franz-go,
// and peak RSS 0.96-1.26x raw's; with 512 KiB a partition, 0.64-0.83x
// (256 KiB gave 0.55-0.62x but cost noop throughput: BENCHMARKS.md,
// "Memory"). A partition's fetch of such records is still some 17,000 of
// them, and of noop's 100-byte ones 4,000, four windows. Override with
// ClientOptions(kgo.FetchMaxPartitionBytes(n)).
func fetchPartitionBytes(maxBytes int64) int32 {
	return int32(min(max(maxBytes/128, 64<<10), 1<<20))
}
