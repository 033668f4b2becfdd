package kparprom_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/kparprom"
)

func TestShareCollectorExportsShareStats(t *testing.T) {
	m := kparprom.New()
	st := kpar.ShareStats{Group: "g", Running: true, Acquired: 7, InFlight: 3, Retrying: 1, Received: 100, Redelivered: 4,
		MaxDeliveryCount: 2, DeliveryLimit: 5, Accepted: 90, DeadLettered: 2, Released: 3, Renewed: 6, AckErrors: 1}
	share := true
	c := m.ShareCollector(func() (kpar.ShareStats, bool) { return st, share })
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	want := `
# HELP kpar_share_acknowledgements_total Acknowledgements sent, by kind: accept (handled), dead_letter (accepted once the sink acknowledged it), release (handed back at shutdown), renew (lock renewals).
# TYPE kpar_share_acknowledgements_total counter
kpar_share_acknowledgements_total{kind="accept"} 88
kpar_share_acknowledgements_total{kind="dead_letter"} 2
kpar_share_acknowledgements_total{kind="release"} 3
kpar_share_acknowledgements_total{kind="renew"} 6
# HELP kpar_share_acquired_records Records this share-group member holds: polled and not acknowledged yet.
# TYPE kpar_share_acquired_records gauge
kpar_share_acquired_records 7
# HELP kpar_share_max_delivery_count Highest delivery count among the records polled.
# TYPE kpar_share_max_delivery_count gauge
kpar_share_max_delivery_count 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"kpar_share_acknowledgements_total", "kpar_share_acquired_records", "kpar_share_max_delivery_count"); err != nil {
		t.Fatal(err)
	}
	if ok, why := m.Ready(); !ok || why != "share group g: 7 records acquired, 3 in flight" {
		t.Errorf("Ready() = %v %q, want the share member ready", ok, why)
	}
	st.Running = false
	if ok, why := m.Ready(); ok || why != "share group g: consumer not running" {
		t.Errorf("Ready() = %v %q after the run, want not ready", ok, why)
	}
	share = false
	if ok, why := m.Ready(); ok || why != "consumer not started" {
		t.Errorf("Ready() = %v %q without a share group, want the hooks' readiness", ok, why)
	}
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Fatalf("%d metrics for a consumer without ShareGroup, want 0", n)
	}
}
