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
		f.OnFetchBatchRead(kgo.BrokerMetadata{}, "t", 0, kgo.FetchBatchMetrics{CompressedBytes: compressed, UncompressedBytes: uncompressed})
	}

	cl, f := client()
	if fetch, part := sizes(cl); fetch != 8<<20/maxRatio || part != 4<<10 {
		t.Fatalf("before any batch: fetch %d, partition %d; want 64 MiB/8/%d and the least, 4 KiB", fetch, part, maxRatio)
	}
	read(f, 32<<10, 640<<10) // 20 times
	f.adjust(cl)
	if fetch, part := sizes(cl); fetch != 8<<20/20 || part != 1<<20/20 {
		t.Fatalf("after batches compressed 20 times: fetch %d, partition %d; want 8 MiB and 1 MiB over 20", fetch, part)
	}
	read(f, 1<<10, 1<<10)
	f.adjust(cl)
	if fetch, _ := sizes(cl); fetch != 8<<20/20 {
		t.Fatalf("judged a new ratio on 1 KiB of batches: fetch %d", fetch)
	}
	read(f, 100<<10, 100<<10)
	f.adjust(cl)
	if fetch, part := sizes(cl); fetch != 8<<20 || part != 1<<20 {
		t.Fatalf("after uncompressed batches: fetch %d, partition %d; want 8 MiB and 1 MiB", fetch, part)
	}

	cl, f = client(kgo.FetchMaxBytes(1 << 20))
	read(f, 1<<20, 20<<20)
	f.adjust(cl)
	if fetch, _ := sizes(cl); fetch != 1<<20 {
		t.Fatalf("ClientOptions' FetchMaxBytes 1 MiB became %d", fetch)
	}
}
