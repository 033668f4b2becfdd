package kparprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/kparprom"
)

// TestMetricsCoverEveryClientOfAConsumerWithOutputs runs a Consumer that
// emits outputs (a producer client beside the group's), at least once and
// exactly once, with ClientOpts: kprom's collectors are registered once
// (this panicked with "duplicate metrics collector registration"), the
// produced outputs are counted, and Run's end unregisters them.
func TestMetricsCoverEveryClientOfAConsumerWithOutputs(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []kpar.ConsumerOpt
	}{
		{"at least once", []kpar.ConsumerOpt{kpar.Outputs()}},
		{"exactly once", []kpar.ConsumerOpt{kpar.ExactlyOnce(), kpar.TransactionalID("clients-eos")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const topic, out, n = "in", "out", 20
			cluster := newCluster(t, topic, 2)
			if err := cluster.CreateTopic(out, 2, nil); err != nil {
				t.Fatal(err)
			}
			produce(t, cluster, topic, n, 4)
			m := kparprom.New()
			cons := newConsumer(t, cluster, m, "g-outputs", topic, func(ctx context.Context, r *kgo.Record) error {
				return kpar.Emit(ctx, &kgo.Record{Topic: out, Key: r.Key, Value: r.Value})
			}, tc.opts...)
			stop := run(t, cons)
			eventually(t, 30*time.Second, "records handled", func() bool { return m.Totals().Handled >= n })
			eventually(t, 30*time.Second, "outputs counted", func() bool {
				return sum(t, m.Registry(), "kpar_client_produce_bytes_total", map[string]string{"topic": out}) > 0
			})
			if got := sum(t, m.Registry(), "kpar_client_fetch_bytes_total", map[string]string{"topic": topic}); got <= 0 {
				t.Errorf("kpar_client_fetch_bytes_total{topic=%q} = %v, want > 0", topic, got)
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := gather(t, m.Registry(), "kpar_client_connects_total"); len(got) != 0 {
				t.Errorf("kpar_client_connects_total still registered after Run returned: %v", got)
			}
		})
	}
}
