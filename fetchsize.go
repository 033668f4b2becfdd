package kpar

// fetchPartitionBytes is kpar's default kgo.FetchMaxPartitionBytes, from
// MaxBufferedBytes: a 256th of it, between 64 KiB and franz-go's default
// 1 MiB (256 KiB at the default 64 MiB).
//
// A fetch's wire bytes understate what it weighs once decoded: franz-go
// gives each record a 160-byte kgo.Record in a slab per batch, and the
// key and value alias the response body, which stays live with any of
// them. A 16-byte record costs about 30 bytes on the wire and over 200
// decoded. kpar's poller takes the next fetch while workers still hold
// the last, and franz-go buffers one more meanwhile, so up to three
// fetches are live where a plain poll loop holds one or two. With
// franz-go's 1 MiB per partition, kpar bench memory (10^7 records of
// 16 bytes, 8 partitions) found up to 80 MB live in kpar against 52 MB
// in raw franz-go, and a peak RSS of 1.0-1.5x raw's; with 256 KiB,
// 0.55-0.65x. Records this small come 8,000 a partition per fetch, still
// eight windows' worth. ClientOptions(kgo.FetchMaxPartitionBytes(n))
// overrides it.
func fetchPartitionBytes(maxBytes int64) int32 {
	return int32(min(max(maxBytes/128, 64<<10), 1<<20))
}
