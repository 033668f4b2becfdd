package kpar

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestFetchSizesShrinkByTheCompressionSeen: the fetch sizes derived from
// MaxBufferedBytes start divided by the most compression, follow the ratio
// of the batches read once there are enough of them, and are left alone
// when ClientOptions set them.
func TestFetchSizesShrinkByTheCompressionSeen(t *testing.T) {
	client := func(extra ...kgo.Opt) (*kgo.Client, *fetchSizer) {
		t.Helper()
		var f fetchSizer
		var opts []kgo.Opt
		f.fetch, f.part, opts = fetchSizing(64 << 20)
		cl, err := kgo.NewClient(append(append(opts, kgo.SeedBrokers("127.0.0.1:1")), extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		f.start(cl)
		return cl, &f
	}
	sizes := func(cl *kgo.Client) (int32, int32) {
		return cl.OptValue(kgo.FetchMaxBytes).(int32), cl.OptValue(kgo.FetchMaxPartitionBytes).(int32)
	}
	read := func(f *fetchSizer, compressed, uncompressed int) {
		f.OnFetchBatchRead(kgo.BrokerMetadata{}, "t", 0, kgo.FetchBatchMetrics{CompressedBytes: compressed, UncompressedBytes: uncompressed, NumRecords: 1})
	}

	cl, f := client()
	if fetch, part := sizes(cl); fetch != 8<<20 || part != 512<<10 {
		t.Fatalf("before any batch: fetch %d, partition %d; want 8 MiB and 512 KiB, undivided", fetch, part)
	}
	read(f, 64<<10, 1280<<10) // 20 times
	f.adjust(cl)
	if fetch, part := sizes(cl); fetch != 8<<20/20 || part != 512<<10/20 {
		t.Fatalf("after batches compressed 20 times: fetch %d, partition %d; want 8 MiB and 512 KiB over 20", fetch, part)
	}
	read(f, 1<<10, 1<<10)
	f.adjust(cl)
	if fetch, _ := sizes(cl); fetch != 8<<20/20 {
		t.Fatalf("judged a new ratio on 1 KiB of batches: fetch %d", fetch)
	}
	read(f, 100<<10, 100<<10)
	f.adjust(cl)
	if fetch, part := sizes(cl); fetch != 8<<20 || part != 512<<10 {
		t.Fatalf("after uncompressed batches: fetch %d, partition %d; want 8 MiB and 512 KiB", fetch, part)
	}

	cl, f = client(kgo.FetchMaxBytes(1 << 20))
	read(f, 1<<20, 20<<20)
	f.adjust(cl)
	if fetch, _ := sizes(cl); fetch != 1<<20 {
		t.Fatalf("ClientOptions' FetchMaxBytes 1 MiB became %d", fetch)
	}
}
func TestFetchPartitionBytesIsAHundredTwentyEighthOfTheBudgetWithinBounds(t *testing.T) {
	for _, c := range []struct {
		maxBytes int64
		want     int32
	}{
		{1 << 10, 64 << 10},   // the least budget: franz-go's fetches still make progress
		{8 << 20, 64 << 10},   // a 128th is exactly the floor
		{64 << 20, 512 << 10}, // the default
		{128 << 20, 1 << 20},  // franz-go's own default
		{1 << 40, 1 << 20},    // never above it
	} {
		if got := fetchPartitionBytes(c.maxBytes); got != c.want {
			t.Errorf("fetchPartitionBytes(%d) = %d, want %d", c.maxBytes, got, c.want)
		}
	}
}

// clientFetchPartitionBytes builds the group source's client for set, as
// open does (the client connects lazily: no broker is needed), and reads
// its FetchMaxPartitionBytes.
func clientFetchPartitionBytes(t *testing.T, set func(*cfg)) int32 {
	t.Helper()
	e := testEngine(func(c *cfg) {
		c.group, c.topics, c.brokers = "g", []string{"t"}, []string{"127.0.0.1:1"}
		if set != nil {
			set(c)
		}
	})
	cl, err := kgo.NewClient(newGroupSource(e).clientOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	return cl.OptValue(kgo.FetchMaxPartitionBytes).(int32)
}

func TestTheGroupClientFetchesPerPartitionWhatTheBudgetAllowsUnlessClientOptionsSayOtherwise(t *testing.T) {
	if got := clientFetchPartitionBytes(t, nil); got != 512<<10 {
		t.Errorf("default FetchMaxPartitionBytes %d, want 512 KiB (a 128th of the default 64 MiB budget)", got)
	}
	if got := clientFetchPartitionBytes(t, func(c *cfg) { c.maxBytes = 256 << 20 }); got != 1<<20 {
		t.Errorf("with a 256 MiB budget: %d, want franz-go's 1 MiB", got)
	}
	given := func(c *cfg) { c.clientOpts = append(c.clientOpts, kgo.FetchMaxPartitionBytes(3<<20)) }
	if got := clientFetchPartitionBytes(t, given); got != 3<<20 {
		t.Errorf("with ClientOptions(kgo.FetchMaxPartitionBytes(3 MiB)): %d, want 3 MiB", got)
	}
}

// TestSmallRecordsAreFetchedUndivided: records smaller than largeRecord on
// average are fetched at fetchSizing's sizes however well they compress
// (dividing them cost kpar bench noop a fifth of its rate).
func TestSmallRecordsAreFetchedUndivided(t *testing.T) {
	var f fetchSizer
	var opts []kgo.Opt
	f.fetch, f.part, opts = fetchSizing(64 << 20)
	cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers("127.0.0.1:1"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	f.start(cl)
	f.OnFetchBatchRead(kgo.BrokerMetadata{}, "t", 0, kgo.FetchBatchMetrics{CompressedBytes: 64 << 10, UncompressedBytes: 640 << 10, NumRecords: 6400})
	f.adjust(cl)
	if fetch, part := cl.OptValue(kgo.FetchMaxBytes).(int32), cl.OptValue(kgo.FetchMaxPartitionBytes).(int32); fetch != 8<<20 || part != 512<<10 {
		t.Fatalf("after 100-byte records compressed 10 times: fetch %d, partition %d; want 8 MiB and 512 KiB", fetch, part)
	}
}
