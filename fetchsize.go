package kpar

import "github.com/twmb/franz-go/pkg/kgo"

// fetchSizing is a group member's fetch sizes, derived from
// MaxBufferedBytes so that the client's fetched records, which wait for
// the budget to admit them, stay a fraction of it too: fetches of a
// quarter of it (at least 64 KiB, at most franz-go's 50 MiB), a partition's
// part of one at most franz-go's 1 MiB default, and no more fetches in
// flight or buffered at once than make half of it (at least one). A broker
// still returns a partition's first batch whatever its size, so a record
// larger than these is fetched all the same. ClientOptions override each.
func fetchSizing(maxBytes int64) []kgo.Opt {
	fetch := min(max(maxBytes/4, 64<<10), 50<<20)
	return []kgo.Opt{
		kgo.FetchMaxBytes(int32(fetch)),
		kgo.FetchMaxPartitionBytes(int32(min(fetch, 1<<20))),
		kgo.MaxConcurrentFetches(int(max(1, maxBytes/2/fetch))),
	}
}
