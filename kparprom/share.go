package kparprom

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpar/kpar"
)

// ShareCollector returns a collector of a share-group member's state, read
// at scrape time from stats (kpar.Consumer.ShareStats); it collects
// nothing while stats reports false:
//
//	<ns>_share_acquired_records             records held: polled, not acknowledged yet
//	<ns>_share_in_flight_records            records a handler runs now
//	<ns>_share_retrying_records             held records waiting for their retry backoff
//	<ns>_share_received_records_total       records polled
//	<ns>_share_redelivered_records_total    records polled with a delivery count above 1
//	<ns>_share_max_delivery_count           highest delivery count seen
//	<ns>_share_delivery_count_limit         the broker's delivery-count limit
//	<ns>_share_acknowledgements_total{kind} accept (handled), dead_letter (accepted after the sink), release, renew
//	<ns>_share_ack_errors_total             partitions whose acknowledgements failed
//
// Register it beside (or instead of) PartitionCollector for a Consumer
// with kpar.ShareGroup, which has no partition windows. The hook metrics
// (handled, failed, dead-lettered, latency) work in both modes. From then
// on Ready (and <ns>_ready) follow stats for a share-group member, which
// has no assignment for the hooks to report: ready while it runs.
func (m *Metrics) ShareCollector(stats func() (kpar.ShareStats, bool)) prometheus.Collector {
	m.ready.mu.Lock()
	m.ready.share = stats
	m.ready.mu.Unlock()
	ns := m.cfg.namespace
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "share", name), help, labels, nil)
	}
	return &shareCollector{
		stats:       stats,
		acquired:    d("acquired_records", "Records this share-group member holds: polled and not acknowledged yet."),
		inFlight:    d("in_flight_records", "Records a handler runs now."),
		retrying:    d("retrying_records", "Held records waiting for their retry backoff (their locks are renewed)."),
		received:    d("received_records_total", "Records polled from the share group."),
		redelivered: d("redelivered_records_total", "Records polled that the broker had delivered before (delivery count above 1)."),
		maxDelivery: d("max_delivery_count", "Highest delivery count among the records polled."),
		limit:       d("delivery_count_limit", "The broker's delivery-count limit (group.share.delivery.count.limit) as read at start."),
		acks:        d("acknowledgements_total", "Acknowledgements sent, by kind: accept (handled), dead_letter (accepted once the sink acknowledged it), release (handed back at shutdown), renew (lock renewals).", "kind"),
		ackErrors:   d("ack_errors_total", "Partitions whose acknowledgements the broker or client reported failed; their records are delivered again."),
	}
}

type shareCollector struct {
	stats                                               func() (kpar.ShareStats, bool)
	acquired, inFlight, retrying, received, redelivered *prometheus.Desc
	maxDelivery, limit, acks, ackErrors                 *prometheus.Desc
}

func (c *shareCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.acquired, c.inFlight, c.retrying, c.received, c.redelivered, c.maxDelivery, c.limit, c.acks, c.ackErrors} {
		ch <- d
	}
}

func (c *shareCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.stats()
	if !ok {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.acquired, float64(st.Acquired))
	gauge(c.inFlight, float64(st.InFlight))
	gauge(c.retrying, float64(st.Retrying))
	counter(c.received, st.Received)
	counter(c.redelivered, st.Redelivered)
	gauge(c.maxDelivery, float64(st.MaxDeliveryCount))
	gauge(c.limit, float64(st.DeliveryLimit))
	counter(c.acks, st.Accepted-st.DeadLettered, "accept")
	counter(c.acks, st.DeadLettered, "dead_letter")
	counter(c.acks, st.Released, "release")
	counter(c.acks, st.Renewed, "renew")
	counter(c.ackErrors, st.AckErrors)
}

// shareReady is Ready for a share-group member.
func shareReady(st kpar.ShareStats) (bool, string) {
	if !st.Running {
		return false, "share group " + st.Group + ": consumer not running"
	}
	return true, fmt.Sprintf("share group %s: %d records acquired, %d in flight", st.Group, st.Acquired, st.InFlight)
}
