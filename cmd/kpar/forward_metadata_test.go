package main

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestForwardConsumesAnAddedPartitionSoon: a partition added to a topic
// that a classic group consumes is consumed within seconds (the metadata
// refresh, --metadata-max-age 10s by default, then a rebalance). It waited
// for franz-go's default refresh, 5 minutes, with its records unconsumed
// (4,010 in the probe).
func TestForwardConsumesAnAddedPartitionSoon(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1")
	const n = 10
	produceIndexed(ctx, t, "grow", n, 2, kgo.SeedBrokers(addr))
	ep := newEndpoint(t, func(int, int) reply { return reply{} })
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "grow", "--topic", "grow", "--url", ep.srv.URL, "--log-level", "warn")
	ep.waitFor(ctx, t, p, "the first partition's records", func() bool { return ep.delivered() == n })

	cl := newClient(t, addr, kgo.DefaultProduceTopic("grow"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreatePartitions(ctx, 1, "grow"); err != nil {
		t.Fatal(err)
	}
	var rs []*kgo.Record
	for i := n; i < 2*n; i++ {
		rs = append(rs, &kgo.Record{Partition: 1, Key: []byte("new"), Value: []byte(strconv.Itoa(i)),
			Headers: []kgo.RecordHeader{{Key: "source", Value: []byte("e2e")}}})
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("producing to the new partition: %v", err)
	}
	added := time.Now()
	// The refresh (10s) and a rebalance, with room for a loaded machine;
	// far below the 5 minutes it took.
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	ep.waitFor(wctx, t, p, "the new partition's records", func() bool { return ep.delivered() == 2*n })
	t.Logf("the new partition's records were delivered %v after it was added", time.Since(added).Round(100*time.Millisecond))
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
}
