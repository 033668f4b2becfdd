package kpar

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
