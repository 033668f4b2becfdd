package kpar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ShareGroup makes the Consumer a member of the share group name (KIP-932,
// Kafka 4.2+) instead of a consumer group: the broker hands the records of
// each partition to every member of the group and tracks each record by
// itself, so members are not limited by the partition count. It replaces
// Group (giving both is an error).
//
// The Handler, BatchHandler, Concurrency, hooks, MaxAttempts,
// RetryBackoff, AttemptTimeout, Permanent, RetryAfter, DeadLetters and
// ShutdownTimeout work as for a consumer group; each outcome becomes an
// acknowledgement:
//
//   - success: ACCEPT.
//   - a failed attempt: retried here, with kpar's backoff, while the record
//     stays acquired by this member; kpar RENEWs the broker's acquisition
//     lock (KIP-1222) while a record runs or waits, so a RELEASE, which the
//     broker redelivers at once and counts against its delivery limit, is
//     never how kpar retries.
//   - Permanent, or MaxAttempts used up: written to the DeadLetters sink
//     first and ACCEPTed only once the sink acknowledged it; while the sink
//     fails the record stays acquired and unacknowledged. A record on its
//     last delivery (the broker's group.share.delivery.count.limit) is
//     treated alike. Without a sink, a record is retried until it
//     succeeds.
//   - shutdown: records not started are RELEASEd for other members, but
//     those on their last delivery, which a RELEASE would make the broker
//     archive unseen: they are run. Running records finish within
//     ShutdownTimeout; what is left then is RELEASEd (a record on its last
//     delivery among them is archived by the broker, and kpar logs it).
//
// Share groups order nothing. ByKey (the default) means at most one record
// per key (and topic) at a time within this Consumer: records of one key
// run one after the other here, but other members may run other records
// of that key at the same time. Unordered runs anything. ByPartition is
// refused: a share group spreads a partition over its members. RetryTopics
// and InstanceID are refused too (retries stay local; share groups have
// no static membership), and so is AdaptiveConcurrency for now. The
// window, commit and rebalance options (WindowRecords, CommitInterval,
// CommitMetadataBytes, RevokeTimeout, StuckAfter) have no effect.
//
// franz-go accepts, at the next poll, every record of a poll that has no
// final acknowledgement yet; kpar therefore polls again only when every
// record of the last poll (up to twice Concurrency records, times
// BatchSize with NewBatch) is acknowledged. A record waiting for its retry
// holds back this member's next poll, not the group's: other members go
// on.
//
// A share group reads from the newest record unless its
// share.auto.offset.reset says otherwise; when that config is not set,
// kpar sets it to earliest at start, as a consumer group starts at the
// oldest record (it logs instead if it may not alter the group's config).
//
// Consumer.ShareStats reports what the member holds and how its records
// were acknowledged; Consumer.Partitions returns nil in this mode.
func ShareGroup(name string) ConsumerOpt {
	return consumerOpt(func(c *cfg) { c.shareGroup = name })
}

// ShareStats is a snapshot of a Consumer running with ShareGroup. The
// counters count from the start of the current (or last) Run.
type ShareStats struct {
	Group string
	// Running is true from the moment Run has a client that reached the
	// brokers until its shutdown begins.
	Running bool
	// Acquired counts the records this member holds: polled and not
	// acknowledged yet (queued, running, waiting for a retry, or waiting
	// for the dead-letter sink).
	Acquired int
	// InFlight counts the records a handler runs now.
	InFlight int
	// Retrying counts acquired records waiting for their retry backoff.
	Retrying int
	// Polls counts polls that returned records.
	Polls int64
	// Received counts the records polled; Redelivered those among them
	// the broker had delivered before (delivery count above 1).
	Received, Redelivered int64
	// MaxDeliveryCount is the highest delivery count among the records
	// polled; DeliveryLimit the broker's limit as read at start (5,
	// Kafka's default, when it could not be read).
	MaxDeliveryCount, DeliveryLimit int32
	// Accepted counts ACCEPT acknowledgements: records handled, and the
	// DeadLettered records, accepted after the sink acknowledged them.
	Accepted, DeadLettered int64
	// Released counts RELEASE acknowledgements: records handed back at
	// shutdown.
	Released int64
	// Renewed counts lock renewals (RENEW acknowledgements) sent.
	Renewed int64
	// AckErrors counts partitions whose acknowledgements the broker (or
	// the client) reported failed: their records are delivered again.
	AckErrors int64
}

// ShareStats returns a snapshot of the share-group member (zero counters
// before the first Run), and false when the Consumer is not configured
// with ShareGroup.
func (c *Consumer) ShareStats() (ShareStats, bool) {
	if c.cfg.shareGroup == "" {
		return ShareStats{}, false
	}
	c.mu.Lock()
	s := c.share
	c.mu.Unlock()
	if s == nil {
		return ShareStats{Group: c.cfg.shareGroup}, true
	}
	return s.snapshot(), true
}

// validateShare checks the options that a share group does not support.
func (c *cfg) validateShare() error {
	switch {
	case c.group != "":
		return errors.New("kpar: both Group and ShareGroup given: a Consumer is a member of one consumer group or one share group; keep one")
	case c.ordering == ByPartition:
		return errors.New("kpar: Ordering(ByPartition) cannot be kept in a share group, which hands one partition's records to many members at once: use ByKey (one record per key at a time in this Consumer) or Unordered, or Group for per-partition order")
	case len(c.retryTopics) > 0:
		return errors.New("kpar: RetryTopics is not supported with ShareGroup: failed records are retried while this member holds them (MaxAttempts, RetryBackoff), then go to DeadLetters; use Group for retry topics")
	case c.instanceID != "":
		return errors.New("kpar: InstanceID is not supported with ShareGroup: share groups have no static membership; leave it out")
	case c.adaptive:
		return errors.New("kpar: AdaptiveConcurrency is not supported with ShareGroup yet: set Concurrency instead")
	}
	return nil
}

// shareRec is one acquired record. t carries the record and its failure
// history in the engine's shape, so the engine's per-record helpers serve
// it. Its other fields are guarded by shareRun.mu.
type shareRec struct {
	t       task
	lane    *shareLane // ByKey with a key; nil otherwise
	active  bool       // counted in lane.active: ready, running, retrying or in the sink
	last    bool       // on its last delivery: never released
	renewAt time.Time  // when the acquisition lock is renewed next
	lockLen time.Duration
}

// shareLane is one key's queue in ByKey mode: at most one of its records
// is active, the others wait in offset order.
type shareLane struct {
	key    string
	active int
	queue  []*shareRec
}

// shareRun is one Run of a Consumer with ShareGroup: the poller (Run's
// goroutine), the workers, the dead-letter writer.
type shareRun struct {
	cfg   *cfg
	h     Handler
	bh    BatchHandler
	hooks *hooks
	log   *slog.Logger
	// eng is a bare engine (cfg, hooks, log, batch, attempt slots) for
	// what the share runner shares with the engine and Backfill:
	// dispatched, observe, callBatch, letter, deadLetterUntilAcked, and
	// the watchdog of attempt deadlines.
	eng     *engine
	cl      *kgo.Client // set in run before any goroutine starts
	maxPoll int

	received, redelivered, polls              atomic.Int64
	accepted, deadLettered, released, renewed atomic.Int64
	ackErrors                                 atomic.Int64
	live                                      atomic.Bool // see ShareStats.Running
	maxDelivery, limit                        atomic.Int32

	mu       sync.Mutex
	cond     sync.Cond // workers wait here for ready records or stop
	ready    []*shareRec
	lanes    map[string]*shareLane
	held     map[*shareRec]struct{} // acquired and not acknowledged
	topics   map[string]struct{}    // topics records came from, paused at shutdown
	empty    chan struct{}          // closed when held becomes empty; nil while it is
	timers   map[*shareRec]*time.Timer
	dead     []*shareRec
	deadWake chan struct{}
	running  int
	closing  bool // shutdown began: what has not started is released
	stop     bool // workers exit; timers do not fire
}

func newShareRun(c *Consumer) *shareRun {
	s := &shareRun{
		cfg:   &c.cfg,
		h:     c.handler,
		bh:    c.batch,
		hooks: &c.hooks,
		log:   c.cfg.logger,
		// Twice what the workers run at once: enough to keep them busy
		// across the handover to the next poll, little enough not to
		// sit on records other members could run.
		maxPoll:  min(2*c.cfg.concurrency*c.cfg.batchSize, 1<<15),
		lanes:    make(map[string]*shareLane),
		held:     make(map[*shareRec]struct{}),
		topics:   make(map[string]struct{}),
		timers:   make(map[*shareRec]*time.Timer),
		deadWake: make(chan struct{}, 1),
	}
	s.eng = &engine{cfg: s.cfg, handler: s.h, batch: s.bh, hooks: s.hooks, log: s.log,
		slots: make(attemptSlots, c.cfg.concurrency), stuckAfter: time.Duration(math.MaxInt64)}
	s.cond.L = &s.mu
	s.limit.Store(defaultDeliveryLimit)
	return s
}

// defaultDeliveryLimit is Kafka's group.share.delivery.count.limit.
const defaultDeliveryLimit = 5

func (s *shareRun) snapshot() ShareStats {
	s.mu.Lock()
	st := ShareStats{Acquired: len(s.held), InFlight: s.running, Retrying: len(s.timers)}
	s.mu.Unlock()
	st.Group, st.Running = s.cfg.shareGroup, s.live.Load()
	st.Polls, st.Received, st.Redelivered = s.polls.Load(), s.received.Load(), s.redelivered.Load()
	st.MaxDeliveryCount, st.DeliveryLimit = s.maxDelivery.Load(), s.limit.Load()
	st.Accepted, st.DeadLettered = s.accepted.Load(), s.deadLettered.Load()
	st.Released, st.Renewed, st.AckErrors = s.released.Load(), s.renewed.Load(), s.ackErrors.Load()
	return st
}

// clientOpts are the options of the share consumer's client; with admin
// set, of a plain client for the start-up checks.
func (s *shareRun) clientOpts(admin bool) []kgo.Opt {
	c := s.cfg
	opts := []kgo.Opt{
		kgo.WithLogger(kgoLogger{L: c.logger}),
		kgo.FetchMaxBytes(int32(max(min(c.maxBytes/4, 50<<20), 1<<20))),
	}
	opts = append(opts, c.clientOpts...)
	if len(c.brokers) > 0 {
		opts = append(opts, kgo.SeedBrokers(c.brokers...))
	}
	if admin {
		return opts
	}
	opts = append(opts,
		kgo.ShareGroup(c.shareGroup),
		kgo.ConsumeTopics(c.topics...),
		// The broker acquires up to this many records per fetch; a poll
		// takes as many, and the next poll waits for all of them.
		kgo.ShareMaxRecords(int32(s.maxPoll)),
		kgo.ShareAckCallback(s.onAcks),
	)
	if c.regex {
		opts = append(opts, kgo.ConsumeRegex())
	}
	return opts
}

func (s *shareRun) run(ctx context.Context) error {
	// The checks and the group's configs come first, from a plain client:
	// a share client joins (and its first fetch fixes where the group
	// starts) as soon as it exists.
	admin, err := kgo.NewClient(s.clientOpts(true)...)
	if err != nil {
		return fmt.Errorf("kpar: creating the client: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = admin.Ping(pctx)
	if err == nil {
		s.prepareGroup(pctx, admin)
	}
	cancel()
	admin.Close()
	if err != nil && isFatal(err) {
		return fmt.Errorf("kpar: connecting to the brokers: %w", err)
	}
	cl, err := kgo.NewClient(s.clientOpts(false)...)
	if err != nil {
		return fmt.Errorf("kpar: creating the client: %w", err)
	}
	s.cl = cl
	s.log.Info("kpar: share group member starting", "share_group", s.cfg.shareGroup,
		"topics", s.cfg.topics, "concurrency", s.cfg.concurrency, "ordering", s.cfg.ordering,
		"delivery_limit", s.limit.Load())

	// Handlers keep running while Run drains; hctx is cancelled only when
	// the drain times out, or after Run is done.
	hctx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()
	var workers, deadWriter, watchdog sync.WaitGroup
	for i := range s.cfg.concurrency {
		workers.Go(func() { s.worker(hctx, i) })
	}
	// The engine's watchdog cancels attempts past AttemptTimeout and
	// relays the hard stop to running attempts.
	watchCtx, stopWatchdog := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWatchdog()
	watchdog.Go(func() { s.eng.watchdog(watchCtx, hctx.Done()) })
	if s.cfg.deadLetters != nil {
		deadWriter.Go(func() { s.deadLetterWriter(hctx) })
	}

	s.live.Store(true)
	runErr := s.poll(ctx)
	s.live.Store(false)

	deadline := time.Now().Add(s.cfg.shutdownTimeout)
	reserve := min(s.cfg.shutdownTimeout/5, 2*time.Second)
	s.log.Info("kpar: stopping: releasing records not started, finishing the others", "timeout", s.cfg.shutdownTimeout)
	s.mu.Lock()
	s.closing = true
	release := s.unstartedLocked()
	topics := slices.Collect(maps.Keys(s.topics))
	s.mu.Unlock()
	// Fetch nothing more: the client would acquire the released records
	// again, burning a delivery of each, only to release them at leave.
	if !s.cfg.regex {
		topics = append(topics, s.cfg.topics...)
	}
	cl.PauseFetchTopics(topics...)
	s.settle(release, kgo.AckRelease)

	drainCtx, stopDrain := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(-reserve))
	drained := s.waitAcknowledged(drainCtx)
	stopDrain()
	s.mu.Lock()
	s.stop = true
	stopTimers(s.timers)
	s.cond.Broadcast()
	s.mu.Unlock()
	if !drained {
		runErr = errors.Join(runErr, ErrShutdownTimeout)
	}
	hardStop() // cancels running handlers and the dead-letter writer
	waitTimeout(&workers, max(time.Until(deadline.Add(-reserve/2)), time.Millisecond))
	deadWriter.Wait()
	stopWatchdog()
	watchdog.Wait()

	// What is still held goes back to the group: explicitly, so that no
	// acknowledgement but RELEASE can reach the broker for it.
	s.mu.Lock()
	var left []*shareRec
	for r := range s.held {
		left = append(left, r)
		if r.last {
			s.log.Error("kpar: a record on its last delivery was not finished by the shutdown timeout; the broker archives it when it is released",
				"topic", r.t.Value.rec.Topic, "partition", r.t.Value.rec.Partition, "offset", r.t.Value.rec.Offset)
		}
	}
	s.mu.Unlock()
	if len(left) > 0 {
		s.log.Warn("kpar: shutdown timeout passed with records unfinished; releasing them, they will be delivered again", "unfinished", len(left))
		s.settle(left, kgo.AckRelease)
	}

	leaveWithin(ctx, cl, deadline, s.log, "the broker releases this member's records when their locks expire", func(cctx context.Context) {
		if err := cl.FlushAcks(cctx); err != nil {
			s.log.Warn("kpar: flushing acknowledgements timed out; the broker redelivers those it did not get when their locks expire", "err", err)
		}
	})
	return runErr
}

// Share-group configs kpar reads at start.
const (
	shareAutoOffsetReset  = "share.auto.offset.reset"
	shareDeliveryLimit    = "share.delivery.count.limit"       // group level (Kafka 4.1+)
	brokerShareDeliveries = "group.share.delivery.count.limit" // broker level
)

// prepareGroup reads the group's delivery-count limit (the group's own
// config, else the broker's) and, when the group has no
// share.auto.offset.reset of its own, sets it to earliest. Both are best
// effort: a broker that refuses leaves Kafka's defaults.
func (s *shareRun) prepareGroup(ctx context.Context, cl *kgo.Client) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	rr.ResourceName = s.cfg.shareGroup
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	groupLimit, resetSet := "", false
	if err == nil && len(resp.Resources) == 1 && resp.Resources[0].ErrorCode == 0 {
		for _, c := range resp.Resources[0].Configs {
			dynamic := c.Source == kmsg.ConfigSourceGroupConfig
			switch c.Name {
			case shareAutoOffsetReset:
				resetSet = dynamic
			case shareDeliveryLimit:
				if dynamic && c.Value != nil {
					groupLimit = *c.Value
				}
			}
		}
	} else {
		if err == nil && len(resp.Resources) == 1 {
			err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
		}
		s.log.Warn("kpar: cannot read the share group's configs; assuming the broker's defaults", "share_group", s.cfg.shareGroup, "err", err)
		resetSet = true // do not overwrite what we could not read
	}
	if groupLimit == "" {
		if bcs, err := kadm.NewClient(cl).DescribeBrokerConfigs(ctx); err == nil {
			for _, rc := range bcs {
				for _, c := range rc.Configs {
					if c.Key == brokerShareDeliveries && c.Value != nil {
						groupLimit = *c.Value
					}
				}
			}
		}
	}
	if n, err := strconv.Atoi(groupLimit); err == nil && n > 0 {
		s.limit.Store(int32(n))
	}
	if resetSet {
		return
	}
	alter := kmsg.NewPtrIncrementalAlterConfigsRequest()
	ar := kmsg.NewIncrementalAlterConfigsRequestResource()
	ar.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	ar.ResourceName = s.cfg.shareGroup
	ac := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	ac.Name = shareAutoOffsetReset
	ac.Op = kmsg.IncrementalAlterConfigOpSet
	ac.Value = kmsg.StringPtr("earliest")
	ar.Configs = append(ar.Configs, ac)
	alter.Resources = append(alter.Resources, ar)
	aresp, err := alter.RequestWith(ctx, cl)
	if err == nil && len(aresp.Resources) == 1 {
		err = kerr.ErrorForCode(aresp.Resources[0].ErrorCode)
	}
	if err != nil {
		s.log.Warn("kpar: cannot set share.auto.offset.reset=earliest on the share group; it starts at the newest records (set it with kafka-configs --entity-type groups)",
			"share_group", s.cfg.shareGroup, "err", err)
		return
	}
	s.log.Info("kpar: share group had no share.auto.offset.reset; set it to earliest", "share_group", s.cfg.shareGroup)
}

// letterGroup names the group in dead letters: the consumer group, or the
// share group.
func (c *cfg) letterGroup() string {
	if c.shareGroup != "" {
		return c.shareGroup
	}
	return c.group
}
