package kpar

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

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
