package kparprom

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// endOffsetsReuse is how long listed high watermarks are reused before a
// scrape lists them again: a status page polling every second and a
// Prometheus scrape then cost the brokers one request.
const endOffsetsReuse = time.Second

// PartitionStatus is one assigned partition's window with its high
// watermark and commit lag.
type PartitionStatus struct {
	kpar.PartitionStats
	// HighWatermark is the partition's end offset as last listed from the
	// brokers, or -1 when unknown (no client, or never listed).
	HighWatermark int64
	// Lag is HighWatermark minus the committed offset (Committed, or the
	// group's offset from before this assignment while kpar has committed
	// nothing yet), never below 0; -1 when either is unknown.
	Lag int64
	// Backlog is the records of the partition not finished yet:
	// HighWatermark minus the window start minus the records finished
	// above it (the start is the committed offset while nothing was
	// fetched). It is smaller than Lag whenever records finish out of
	// order, and is what is left to do; -1 when unknown.
	Backlog int64
	// StuckOffset is the offset of the record that has held the window
	// start since kpar reported it stuck (HookRecordStuck), or -1.
	StuckOffset int64
	// StuckFor is how long StuckOffset has held the window start.
	StuckFor time.Duration
}

// PartitionStatus joins a Partitions snapshot with high watermarks, listing
// them from the brokers when those known are older than a second. ctx and
// EndOffsetsTimeout bound the listing; on failure or timeout the last
// watermarks known are used.
func (m *Metrics) PartitionStatus(ctx context.Context, stats []kpar.PartitionStats) []PartitionStatus {
	out := make([]PartitionStatus, len(stats))
	if len(stats) == 0 {
		return out
	}
	hwms, cl := m.ends.get(ctx, stats)
	var groupCommitted map[string]map[int32]kgo.EpochOffset
	for _, s := range stats {
		if s.Committed < 0 && cl != nil {
			groupCommitted = cl.CommittedOffsets()
			break
		}
	}
	now := time.Now()
	for i, s := range stats {
		st := PartitionStatus{PartitionStats: s, HighWatermark: -1, Lag: -1, Backlog: -1, StuckOffset: -1}
		if since, ok := m.held.at(tp{s.Topic, s.Partition}, s.Start); ok {
			st.StuckOffset, st.StuckFor = s.Start, now.Sub(since)
		}
		if hwm, ok := hwms[tp{s.Topic, s.Partition}]; ok {
			st.HighWatermark = hwm
			committed := s.Committed
			if committed < 0 {
				if eo, ok := groupCommitted[s.Topic][s.Partition]; ok {
					committed = eo.Offset
				}
			}
			if committed >= 0 {
				st.Lag = max(hwm-committed, 0)
			}
			switch {
			case s.Start >= 0:
				st.Backlog = max(hwm-s.Start-int64(s.Finished), 0)
			case committed >= 0:
				st.Backlog = st.Lag
			}
		}
		out[i] = st
	}
	return out
}

type tp struct {
	topic     string
	partition int32
}

// endOffsets lists and remembers the high watermarks of the Consumer's
// client.
type endOffsets struct {
	m *Metrics

	// listing serialises listings so that concurrent scrapes share one;
	// it is held across the request, which the timeout bounds.
	listing sync.Mutex

	mu     sync.Mutex // guards the fields below
	cl     *kgo.Client
	hwms   map[tp]int64
	listed time.Time // when hwms were last listed
}

func (e *endOffsets) setClient(cl *kgo.Client) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cl, e.hwms, e.listed = cl, nil, time.Time{}
}

// clearClient forgets cl if it is the Consumer's client and reports
// whether it was.
func (e *endOffsets) clearClient(cl *kgo.Client) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cl != cl {
		return false
	}
	e.cl, e.hwms = nil, nil
	return true
}

// get returns the high watermarks of the partitions in stats, listing them
// when those known are stale or miss a partition, and the client.
func (e *endOffsets) get(ctx context.Context, stats []kpar.PartitionStats) (map[tp]int64, *kgo.Client) {
	e.listing.Lock()
	defer e.listing.Unlock()

	e.mu.Lock()
	cl, listed := e.cl, e.listed
	complete := true
	for _, s := range stats {
		if _, ok := e.hwms[tp{s.Topic, s.Partition}]; !ok {
			complete = false
			break
		}
	}
	e.mu.Unlock()
	if cl == nil {
		return nil, nil
	}

	if !complete || time.Since(listed) >= endOffsetsReuse {
		var topics []string
		for _, s := range stats {
			if !slices.Contains(topics, s.Topic) {
				topics = append(topics, s.Topic)
			}
		}
		lctx, cancel := context.WithTimeout(ctx, e.m.cfg.endOffsetsTimeout)
		ends, err := kadm.NewClient(cl).ListEndOffsets(lctx, topics...)
		cancel()
		if err == nil {
			err = ends.Error()
		}
		if err != nil {
			e.m.lagErrors.Inc()
		}
		e.mu.Lock()
		if e.cl == cl { // not replaced by a new Run meanwhile
			if e.hwms == nil {
				e.hwms = make(map[tp]int64)
			}
			ends.Each(func(o kadm.ListedOffset) {
				if o.Err == nil && o.Offset >= 0 {
					e.hwms[tp{o.Topic, o.Partition}] = o.Offset
				}
			})
			// Also after an error: a failing broker is asked again a
			// second later, not on every scrape.
			e.listed = time.Now()
		}
		e.mu.Unlock()
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[tp]int64, len(stats))
	for _, s := range stats {
		if hwm, ok := e.hwms[tp{s.Topic, s.Partition}]; ok {
			out[tp{s.Topic, s.Partition}] = hwm
		}
	}
	return out, cl
}

// PartitionCollector returns a collector of per-partition gauges read at
// scrape time from stats, normally a Consumer's Partitions method:
//
//	<ns>_partitions_assigned
//	<ns>_partition_window_start{topic,partition}     lowest unfinished offset
//	<ns>_partition_window_end{topic,partition}       offset after the newest fetched record
//	<ns>_partition_window_records{topic,partition}   records from start through end
//	<ns>_partition_window_finished{topic,partition}  records above start already done
//	<ns>_partition_in_flight{topic,partition}        records in a handler now
//	<ns>_partition_paused{topic,partition}           1 while fetching is paused (window full)
//	<ns>_partition_committed_offset{topic,partition} offset kpar last committed
//	<ns>_partition_high_watermark{topic,partition}   end offset listed from the brokers
//	<ns>_partition_commit_lag{topic,partition}       high watermark - committed
//	<ns>_backlog_records{topic,partition}            records not finished: high watermark - start - finished above it
//	<ns>_backlog_records_all                         the sum over the assigned partitions (for autoscaling)
//	<ns>_partition_stuck_seconds{topic,partition}    how long a stuck record has held the start, 0 if none
//
// Offsets that are not known yet (-1) are left out rather than reported as
// -1. The high watermark and the lag need ClientOpts (see PartitionStatus).
func (m *Metrics) PartitionCollector(stats func() []kpar.PartitionStats) prometheus.Collector {
	ns := m.cfg.namespace
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "partition", name), help, []string{"topic", "partition"}, nil)
	}
	return &partitionCollector{
		m:     m,
		stats: stats,
		assigned: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "partitions_assigned"),
			"Partitions assigned to this member.", nil, nil),
		start:     desc("window_start", "Lowest unfinished offset of the partition's window: what a commit stores."),
		end:       desc("window_end", "Offset after the newest record fetched into the window."),
		size:      desc("window_records", "Records in the window, from its start through its end."),
		finished:  desc("window_finished", "Records above the window's start that are already finished."),
		inFlight:  desc("in_flight", "Records of the partition handed to workers and not finished."),
		paused:    desc("paused", "1 while the partition's fetching is paused because its window is full."),
		committed: desc("committed_offset", "Offset kpar last committed for the partition in this assignment."),
		hwm:       desc("high_watermark", "Partition's high watermark as last listed from the brokers."),
		lag:       desc("commit_lag", "High watermark minus the committed offset: records not yet committed."),
		stuck:     desc("stuck_seconds", "How long the record kpar reported stuck has held the window start; 0 when none is stuck."),
		backlog: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "backlog_records"),
			"Records of the partition not finished yet: high watermark minus window start minus records finished above it. Below commit_lag when records finish out of order.",
			[]string{"topic", "partition"}, nil),
		backlogAll: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "backlog_records_all"),
			"Records not finished yet over the partitions assigned to this member: the autoscaling signal.", nil, nil),
	}
}

type partitionCollector struct {
	m     *Metrics
	stats func() []kpar.PartitionStats

	assigned                                                                 *prometheus.Desc
	start, end, size, finished, inFlight, paused, committed, hwm, lag, stuck *prometheus.Desc
	backlog, backlogAll                                                      *prometheus.Desc
}

func (c *partitionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.assigned, c.start, c.end, c.size, c.finished, c.inFlight, c.paused, c.committed, c.hwm, c.lag, c.stuck, c.backlog, c.backlogAll} {
		ch <- d
	}
}

func (c *partitionCollector) Collect(ch chan<- prometheus.Metric) {
	sts := c.m.PartitionStatus(context.Background(), c.stats())
	ch <- prometheus.MustNewConstMetric(c.assigned, prometheus.GaugeValue, float64(len(sts)))
	var all int64
	for _, s := range sts {
		all += max(s.Backlog, 0)
		labels := []string{s.Topic, strconv.Itoa(int(s.Partition))}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		known := func(d *prometheus.Desc, v int64) {
			if v >= 0 {
				gauge(d, float64(v))
			}
		}
		known(c.start, s.Start)
		known(c.end, s.End)
		gauge(c.size, float64(s.Buffered))
		gauge(c.finished, float64(s.Finished))
		gauge(c.inFlight, float64(s.InFlight))
		paused := 0.0
		if s.Paused {
			paused = 1
		}
		gauge(c.paused, paused)
		known(c.committed, s.Committed)
		known(c.hwm, s.HighWatermark)
		known(c.lag, s.Lag)
		gauge(c.stuck, s.StuckFor.Seconds())
		known(c.backlog, s.Backlog)
	}
	ch <- prometheus.MustNewConstMetric(c.backlogAll, prometheus.GaugeValue, float64(all))
}

// stuckRecords remembers, per partition, the record kpar reported stuck
// and since when, until the window start moves past it.
type stuckRecords struct {
	mu   sync.Mutex // guards held
	held map[tp]stuckRecord
}

type stuckRecord struct {
	offset int64
	since  time.Time
}

func (s *stuckRecords) hold(p tp, offset int64, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		s.held = make(map[tp]stuckRecord)
	}
	s.held[p] = stuckRecord{offset, since}
}

// at reports since when the record at start has been stuck, forgetting a
// stuck record that start has moved past.
func (s *stuckRecords) at(p tp, start int64) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.held[p]
	if !ok {
		return time.Time{}, false
	}
	if r.offset != start {
		delete(s.held, p)
		return time.Time{}, false
	}
	return r.since, true
}

func (s *stuckRecords) forget(revoked map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for topic, ps := range revoked {
		for _, p := range ps {
			delete(s.held, tp{topic, p})
		}
	}
}

func (s *stuckRecords) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = nil
}

// OverdueCollector returns a collector of one gauge, read at scrape time
// from overdue (kpar.Consumer.Overdue):
//
//	<ns>_attempts_overdue    handler attempts running past AttemptTimeout at the last check
//
// Handlers that ignore their context keep their worker past AttemptTimeout;
// kpar does not replace them, so this shows how many workers are lost to
// them. Register it beside PartitionCollector.
func (m *Metrics) OverdueCollector(overdue func() int) prometheus.Collector {
	return m.countGauge("attempts_overdue", "Handler attempts running past AttemptTimeout at the last check (their workers are busy).", overdue)
}

// LimitCollector returns a collector of one gauge, read at scrape time from
// limit (kpar.Consumer.ConcurrencyLimit):
//
//	<ns>_concurrency_limit    attempts allowed in flight now (the adaptive limit, or Concurrency)
func (m *Metrics) LimitCollector(limit func() int) prometheus.Collector {
	return m.countGauge("concurrency_limit", "Handler attempts allowed in flight now: the adaptive limit with AdaptiveConcurrency, else Concurrency.", limit)
}

// countGauge is a gauge of the count n returns, read at scrape time.
func (m *Metrics) countGauge(name, help string, n func() int) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: m.cfg.namespace, Name: name, Help: help},
		func() float64 { return float64(n()) })
}
