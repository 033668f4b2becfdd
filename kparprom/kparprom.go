// Package kparprom exports Prometheus metrics for a kpar.Consumer through
// its hook interface, in the style of franz-go's plugin/kprom.
//
// One Metrics observes one Consumer:
//
//	m := kparprom.New()
//	c, err := kpar.New(h,
//		kpar.WithHooks(m),                      // records, commits, rebalances
//		kpar.ClientOptions(m.ClientOpts()...),  // client metrics, lag, readiness
//		...)
//	m.Registry().MustRegister(m.PartitionCollector(c.Partitions), m.OverdueCollector(c.Overdue))
//	http.Handle("/metrics", m.Handler())
//
// Counters and the latency histogram are updated by the hooks as records
// finish: handled, failed attempts (by class), retried, dead-lettered (by
// class), stuck, commits and the OffsetCommit requests they cost, pauses,
// rebalances. Per-partition gauges (window
// start, end and size, finished, in flight, paused, committed offset, high
// watermark, commit lag, stuck time) are read at scrape time by the
// collector that PartitionCollector returns, from the Consumer's
// Partitions snapshot. RecentDeadLetters keeps the latest dead letters for
// a status page.
//
// # Commit lag
//
// Commit lag is the partition's high watermark minus the offset committed
// for it: the records a restart would have to handle again or for the first
// time. kpar does not see high watermarks (a paused partition fetches
// nothing, so fetch responses go stale exactly when lag grows), so the
// collector lists them from the brokers at scrape time with kadm
// ListEndOffsets, through the Consumer's own client, bounded by
// EndOffsetsTimeout and reused for a second so that a status page polling
// every second and a Prometheus scrape share one request. The client is
// captured by a kgo.HookNewClient in ClientOpts: without ClientOpts there is
// no lag. Until kpar commits a partition in the current assignment, the
// group's committed offset as the client fetched it on joining is used.
//
// # Commit traffic
//
// Every member of a consumer group writes its commits to the same
// __consumer_offsets partition, on the group's coordinator. Three counters,
// from kpar.HookCommitRequest, say what one member costs it:
//
//	<ns>_commit_requests_total           OffsetCommit requests sent (commits, retries with smaller metadata, revokes, the final commit; one cancelled in flight at shutdown too)
//	<ns>_commit_request_bytes_total      their encoded size, the finished-offsets metadata included
//	<ns>_commit_request_partitions_total partitions they carried
//
// Like the other metrics they describe the one Consumer the Metrics
// observe: a member is told apart by its scrape target's labels (instance,
// pod). The rates and ratios are PromQL:
//
//	rate(kpar_commit_requests_total[1m])                                    # commit requests/s of each member
//	sum without (instance, pod) (rate(kpar_commit_requests_total[1m]))     # ... of the whole group, what its coordinator receives
//	rate(kpar_commit_request_bytes_total[1m])                               # OffsetCommit bytes/s of each member
//	rate(kpar_commit_request_partitions_total[1m])
//	  / rate(kpar_commit_requests_total[1m])                                # partitions per commit
//	rate(kpar_commit_request_bytes_total[1m])
//	  / rate(kpar_commit_requests_total[1m])                                # bytes per commit
//
// A consumer in key mode with a 5 ms handler sends on the order of 170
// requests a second at the default CommitInterval; BENCHMARKS.md ("Commit
// traffic") has the figures per group size.
//
// # Readiness
//
// Ready reports whether the Consumer is a member of its group: it turns
// true when an assignment completes, including an empty one (franz-go calls
// the assignment callback after every join, so a member with no partitions
// is idle cleanly, and ready), and false when the session is lost or fails
// (kgo.HookGroupManageError) or the client closes.
package kparprom

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
)

var (
	_ kpar.HookRecordDispatched   = (*Metrics)(nil)
	_ kpar.HookRecordDone         = (*Metrics)(nil)
	_ kpar.HookAttemptFailed      = (*Metrics)(nil)
	_ kpar.HookCommit             = (*Metrics)(nil)
	_ kpar.HookCommitRequest      = (*Metrics)(nil)
	_ kpar.HookPartitionPaused    = (*Metrics)(nil)
	_ kpar.HookPartitionsAssigned = (*Metrics)(nil)
	_ kpar.HookPartitionsRevoked  = (*Metrics)(nil)
	_ kpar.HookRecordStuck        = (*Metrics)(nil)
	_ kpar.HookDeadLettered       = (*Metrics)(nil)
	_ kpar.HookDeadLetterFailed   = (*Metrics)(nil)

	_ kgo.HookNewClient        = (*clientHooks)(nil)
	_ kgo.HookClientClosed     = (*clientHooks)(nil)
	_ kgo.HookGroupManageError = (*clientHooks)(nil)
)

// Metrics collects a Consumer's metrics. Pass it to kpar.WithHooks, and its
// ClientOpts to kpar.ClientOptions. Its methods are safe for concurrent use.
type Metrics struct {
	cfg     cfg
	reg     RegistererGatherer
	kprom   *kprom.Metrics
	clients *sharedClient // m.kprom for every client of the Consumer: clients.go

	attempts     *prometheus.CounterVec   // topic
	retried      *prometheus.CounterVec   // topic
	handled      *prometheus.CounterVec   // topic
	failed       *prometheus.CounterVec   // topic, class
	latency      *prometheus.HistogramVec // topic
	commits      prometheus.Counter
	commitErrors prometheus.Counter
	commitReqs   prometheus.Counter
	commitBytes  prometheus.Counter
	commitParts  prometheus.Counter
	pauses       *prometheus.CounterVec // topic
	assigned     *prometheus.CounterVec // topic
	revoked      *prometheus.CounterVec // topic
	lost         *prometheus.CounterVec // topic
	lagErrors    prometheus.Counter
	stuck        *prometheus.CounterVec // topic
	deadLettered *prometheus.CounterVec // topic, class
	deadFailed   prometheus.Counter

	totals struct {
		handled, failed, retried, deadLettered, deadLetterErrors, stuck atomic.Int64
	}

	ready readiness
	ends  endOffsets
	dead  deadLetterRing
	held  stuckRecords
}

// New returns Metrics registered in their registry (see Registry). It
// panics if the registry already holds metrics of the same names, as
// prometheus.MustRegister does.
func New(opts ...Opt) *Metrics {
	c := defaultCfg()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.reg == nil {
		c.reg = prometheus.NewRegistry()
	}
	m := &Metrics{cfg: c, reg: c.reg}
	m.dead.max = c.recentDeadLetters
	m.ready.reason = "consumer not started"
	m.ends.m = m

	ns := c.namespace
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	m.attempts = counter("attempts_total", "Handler attempts started (dispatches), first attempts and retries.", "topic")
	m.retried = counter("records_retried_total", "Handler attempts that retried a record after a failed attempt.", "topic")
	m.handled = counter("records_handled_total", "Records handled successfully.", "topic")
	m.failed = counter("attempts_failed_total", "Failed handler attempts, by class: error, panic, timeout (the attempt's deadline passed) or permanent (kpar.Permanent).", "topic", "class")
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "handler_latency_seconds",
		Help:    "Time from a record's first dispatch to a handler to its successful handling; for a record that succeeded at once this is the handler's run time, otherwise it includes failed attempts and backoff.",
		Buckets: c.latencyBuckets,
	}, []string{"topic"})
	m.commits = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "commits_total", Help: "Offset commits kpar attempted."})
	m.commitErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "commit_errors_total", Help: "Offset commits that failed in whole or in part (not counting one cancelled by shutdown)."})
	m.commitReqs = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "commit_requests_total", Help: "OffsetCommit requests this member sent to its group's coordinator: interval commits, retries with smaller metadata, revokes and the final commit."})
	m.commitBytes = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "commit_request_bytes_total", Help: "Encoded size of the OffsetCommit requests sent, the finished-offsets metadata included."})
	m.commitParts = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "commit_request_partitions_total", Help: "Partitions the OffsetCommit requests sent carried; over commit_requests_total, the partitions per commit."})
	m.pauses = counter("partition_pauses_total", "Times a partition's fetching was paused because its window filled.", "topic")
	m.assigned = counter("partitions_assigned_total", "Partitions assigned to this member.", "topic")
	m.revoked = counter("partitions_revoked_total", "Partitions revoked from this member after draining and committing them.", "topic")
	m.lost = counter("partitions_lost_total", "Partitions lost by this member (dropped without a commit).", "topic")
	m.stuck = counter("records_stuck_total", "Records reported stuck: they held their partition's window start (and its commits) for StuckAfter.", "topic")
	m.deadLettered = counter("records_dead_lettered_total", "Records the dead-letter sink acknowledged, by class: permanent, exhausted, timeout or panic.", "topic", "class")
	m.deadFailed = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "dead_letter_errors_total", Help: "Failed writes to a retry topic or the dead-letter sink; their records stay unfinished and the write is retried."})
	m.lagErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "high_watermark_errors_total", Help: "Failed listings of high watermarks; commit lag keeps the last watermarks known."})
	readyGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "ready", Help: "1 while the consumer is a member of its group (with partitions or idle), else 0."},
		func() float64 {
			if ok, _ := m.Ready(); ok {
				return 1
			}
			return 0
		})
	c.reg.MustRegister(m.attempts, m.retried, m.handled, m.failed, m.latency, m.commits, m.commitErrors,
		m.commitReqs, m.commitBytes, m.commitParts,
		m.pauses, m.assigned, m.revoked, m.lost, m.lagErrors, m.stuck, m.deadLettered, m.deadFailed, readyGauge)

	kopts := append([]kprom.Opt{kprom.Registry(c.reg), kprom.Subsystem("client")}, c.clientOpts...)
	m.kprom = kprom.NewMetrics(ns, kopts...)
	m.clients = &sharedClient{k: m.kprom}
	return m
}

// Registry returns the registry the metrics are in, to add collectors to
// (such as PartitionCollector's) or to gather from.
func (m *Metrics) Registry() RegistererGatherer { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Timeout: 10 * time.Second, ErrorHandling: promhttp.ContinueOnError})
}

// ClientOpts returns the franz-go options to give the Consumer's client
// through kpar.ClientOptions: hooks for franz-go's kprom metrics
// (<namespace>_client_*), for the client that lists high watermarks (commit
// lag), and for group errors (readiness). Give them to one Consumer only;
// the clients it builds from them (the group's, the producer of its
// outputs) share one set of client metrics.
func (m *Metrics) ClientOpts() []kgo.Opt {
	return []kgo.Opt{kgo.WithHooks(m.clients, &clientHooks{m})}
}

// Totals counts what the hooks saw since New.
type Totals struct {
	Handled          int64 `json:"handled"`            // records handled successfully
	Failed           int64 `json:"failed"`             // failed attempts
	Retried          int64 `json:"retried"`            // attempts that retried a record
	DeadLettered     int64 `json:"dead_lettered"`      // records the dead-letter sink acknowledged
	DeadLetterErrors int64 `json:"dead_letter_errors"` // failed retry-topic or dead-letter writes
	Stuck            int64 `json:"stuck"`              // records reported stuck
}

// Totals returns the counts over every topic, for status pages.
func (m *Metrics) Totals() Totals {
	return Totals{
		Handled:          m.totals.handled.Load(),
		Failed:           m.totals.failed.Load(),
		Retried:          m.totals.retried.Load(),
		DeadLettered:     m.totals.deadLettered.Load(),
		DeadLetterErrors: m.totals.deadLetterErrors.Load(),
		Stuck:            m.totals.stuck.Load(),
	}
}

// OnRecordDispatched implements kpar.HookRecordDispatched.
func (m *Metrics) OnRecordDispatched(r *kgo.Record, attempt int) {
	m.attempts.WithLabelValues(r.Topic).Inc()
	if attempt > 1 {
		m.retried.WithLabelValues(r.Topic).Inc()
		m.totals.retried.Add(1)
	}
}

// OnRecordDone implements kpar.HookRecordDone.
func (m *Metrics) OnRecordDone(r *kgo.Record, _ int, latency time.Duration) {
	m.handled.WithLabelValues(r.Topic).Inc()
	m.latency.WithLabelValues(r.Topic).Observe(latency.Seconds())
	m.totals.handled.Add(1)
}

// OnAttemptFailed implements kpar.HookAttemptFailed.
func (m *Metrics) OnAttemptFailed(r *kgo.Record, _ int, err error, _ time.Duration) {
	m.failed.WithLabelValues(r.Topic, failureClass(err)).Inc()
	m.totals.failed.Add(1)
}

// failureClass names why an attempt failed, with the class names of the
// dead-letter headers and kpar's precedence; "error" stands for a plain
// failure that may be retried. A timeout is an attempt whose error is its
// context's deadline: the hook does not say whether kpar cancelled it.
func failureClass(err error) string {
	var pe *kpar.PanicError
	switch {
	case kpar.IsPermanent(err):
		return "permanent"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &pe):
		return "panic"
	}
	return "error"
}

// OnCommit implements kpar.HookCommit. An interval commit cancelled by
// shutdown is not counted as an error: the final commit follows it.
func (m *Metrics) OnCommit(_ map[string]map[int32]int64, err error) {
	m.commits.Inc()
	if err != nil && !errors.Is(err, context.Canceled) {
		m.commitErrors.Inc()
	}
}

// OnCommitRequest implements kpar.HookCommitRequest. A commit that never
// became a request (it failed before kpar built one: no group generation
// yet, or shutdown) carries no bytes and is not counted.
func (m *Metrics) OnCommitRequest(partitions, bytes int, _ error) {
	if bytes <= 0 {
		return
	}
	m.commitReqs.Inc()
	m.commitBytes.Add(float64(bytes))
	m.commitParts.Add(float64(partitions))
}

// OnPartitionPaused implements kpar.HookPartitionPaused.
func (m *Metrics) OnPartitionPaused(topic string, _ int32, _ int) {
	m.pauses.WithLabelValues(topic).Inc()
}

// OnPartitionsAssigned implements kpar.HookPartitionsAssigned.
func (m *Metrics) OnPartitionsAssigned(assigned map[string][]int32) {
	for topic, ps := range assigned {
		m.assigned.WithLabelValues(topic).Add(float64(len(ps)))
	}
	m.ready.assign(assigned)
}

// OnPartitionsRevoked implements kpar.HookPartitionsRevoked.
func (m *Metrics) OnPartitionsRevoked(revoked map[string][]int32, lost bool) {
	c := m.revoked
	if lost {
		c = m.lost
	}
	for topic, ps := range revoked {
		c.WithLabelValues(topic).Add(float64(len(ps)))
	}
	m.ready.revoke(revoked, lost)
	m.held.forget(revoked)
}

// OnRecordStuck implements kpar.HookRecordStuck. The partition counts as
// stuck (see PartitionStatus) until its window start moves.
func (m *Metrics) OnRecordStuck(topic string, partition int32, offset int64, _ int, stuckFor time.Duration) {
	m.stuck.WithLabelValues(topic).Inc()
	m.totals.stuck.Add(1)
	m.held.hold(tp{topic, partition}, offset, time.Now().Add(-stuckFor))
}

// OnDeadLettered implements kpar.HookDeadLettered.
func (m *Metrics) OnDeadLettered(l deadletter.Letter) {
	if l.Record == nil {
		return
	}
	m.deadLettered.WithLabelValues(l.Record.Topic, string(l.Class)).Inc()
	m.totals.deadLettered.Add(1)
	m.dead.add(DeadLetterEntry{
		Time:      time.Now(),
		Topic:     l.Record.Topic,
		Partition: l.Record.Partition,
		Offset:    l.Record.Offset,
		Class:     string(l.Class),
		Attempts:  l.Attempts,
		Error:     l.Message,
	})
}

// OnDeadLetterFailed implements kpar.HookDeadLetterFailed.
func (m *Metrics) OnDeadLetterFailed(_ int, _ error) {
	m.deadFailed.Inc()
	m.totals.deadLetterErrors.Add(1)
}

// clientHooks are the franz-go hooks of ClientOpts, kept off Metrics so
// that Metrics is not mistaken for a kgo hook.
type clientHooks struct{ m *Metrics }

// OnNewClient captures the Consumer's client. kpar also builds a
// throwaway client from ClientOptions to validate them; it has no group and
// is ignored.
func (h *clientHooks) OnNewClient(cl *kgo.Client) {
	group, _ := cl.OptValue(kgo.ConsumerGroup).(string)
	if group == "" {
		return
	}
	h.m.ends.setClient(cl)
	h.m.held.reset()
	h.m.ready.joining(group)
}

// OnClientClosed forgets the Consumer's client when Run ends.
func (h *clientHooks) OnClientClosed(cl *kgo.Client) {
	if h.m.ends.clearClient(cl) {
		h.m.ready.stopped()
	}
}

// OnTopicUnavailable implements kpar.HookTopicUnavailable: the Consumer is
// not ready while a consumed topic is gone from the broker (deleted, or
// deleted and created again, until kpar consumes the new one).
func (m *Metrics) OnTopicUnavailable(topic string, err error) { m.ready.topicGone(topic, err) }

// OnGroupManageError marks the member not ready until it rejoins.
func (h *clientHooks) OnGroupManageError(err error) { h.m.ready.failed(err) }

// readiness tracks group membership from the hooks.
type readiness struct {
	mu       sync.Mutex // guards the fields below
	joined   bool
	group    string
	assigned map[string]map[int32]struct{}
	reason   string           // why not ready, when !joined
	gone     map[string]error // consumed topics the broker no longer has
	// share, set by ShareCollector, reports a share-group member, which
	// has no assignment for the hooks to follow (share.go).
	share func() (kpar.ShareStats, bool)
}

func (r *readiness) topicGone(topic string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.gone, topic)
		return
	}
	if r.gone == nil {
		r.gone = make(map[string]error)
	}
	r.gone[topic] = err
}

func (r *readiness) joining(group string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.group, r.joined, r.assigned = group, false, nil
	r.reason = "joining group " + group
}

func (r *readiness) assign(assigned map[string][]int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.joined = true
	if r.assigned == nil {
		r.assigned = make(map[string]map[int32]struct{})
	}
	for topic, ps := range assigned {
		if r.assigned[topic] == nil {
			r.assigned[topic] = make(map[int32]struct{})
		}
		for _, p := range ps {
			r.assigned[topic][p] = struct{}{}
		}
	}
}

func (r *readiness) revoke(revoked map[string][]int32, lost bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for topic, ps := range revoked {
		for _, p := range ps {
			delete(r.assigned[topic], p)
		}
		if len(r.assigned[topic]) == 0 {
			delete(r.assigned, topic)
		}
	}
	if lost {
		r.joined = false
		r.reason = "partitions lost; rejoining the group"
	}
}

func (r *readiness) failed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.joined, r.assigned = false, nil
	r.reason = "group error: " + err.Error()
}

func (r *readiness) stopped() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.joined, r.assigned = false, nil
	r.reason = "consumer stopped"
}

// Ready reports whether the Consumer is a member of its group, with
// partitions or idle, and says why in a short sentence: "3 partitions
// assigned", "joined, no partitions assigned (idle)", "joining group g",
// "group error: ...", "consumer stopped", "topic t is gone from the broker ...".
func (m *Metrics) Ready() (bool, string) {
	r := &m.ready
	r.mu.Lock()
	share := r.share
	r.mu.Unlock()
	if share != nil {
		if st, ok := share(); ok {
			return shareReady(st)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.joined {
		return false, r.reason
	}
	for topic, err := range r.gone {
		return false, "topic " + topic + " is gone from the broker (" + err.Error() + "); subscribing to it afresh"
	}
	n := 0
	for _, ps := range r.assigned {
		n += len(ps)
	}
	in := ""
	if r.group != "" {
		in = " in group " + r.group
	}
	switch n {
	case 0:
		return true, "joined" + in + ", no partitions assigned (idle)"
	case 1:
		return true, "1 partition assigned" + in
	}
	return true, strconv.Itoa(n) + " partitions assigned" + in
}
