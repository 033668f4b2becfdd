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

	cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	if err := cl.FlushAcks(cctx); err != nil {
		s.log.Warn("kpar: flushing acknowledgements timed out; the broker redelivers those it did not get when their locks expire", "err", err)
	}
	if err := cl.LeaveGroupContext(cctx); err != nil {
		s.log.Warn("kpar: leaving the share group timed out", "err", err)
	}
	cancel()
	cl.Close()
	return runErr
}

// poll fetches records until ctx ends or a fatal error. It polls again only
// once every record of the last poll has its final acknowledgement: the
// client would accept the others at the next poll.
func (s *shareRun) poll(ctx context.Context) error {
	flog := &fetchErrorLog{log: s.log}
	for {
		if !s.waitAcknowledged(ctx) {
			return nil
		}
		fs := s.cl.PollRecords(ctx, s.maxPoll)
		if fs.IsClientClosed() {
			return nil
		}
		if err := fatalFetchError(fs, flog, "share group: "); err != nil {
			s.push(fs)
			return err
		}
		s.push(fs)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// push makes the records of one poll ready (or queues them behind their
// key).
func (s *shareRun) push(fs kgo.Fetches) {
	now := time.Now()
	n := 0
	limit := s.limit.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	fs.EachRecord(func(r *kgo.Record) {
		n++
		rec := &shareRec{}
		rec.t.Value.rec = r
		dc := r.DeliveryCount()
		if dc > 1 {
			s.redelivered.Add(1)
		}
		if dc > s.maxDelivery.Load() {
			s.maxDelivery.Store(dc) // only push writes it
		}
		rec.last = limit > 0 && dc >= limit
		// The time left on the lock stands for its duration: the first
		// renewal comes early rather than late.
		rec.lockLen = max(r.AcquisitionDeadline().Sub(now), 20*time.Millisecond)
		rec.renewAt = now.Add(rec.lockLen / 2)
		s.held[rec] = struct{}{}
		s.topics[r.Topic] = struct{}{}
		if s.cfg.ordering == ByKey && r.Key != nil {
			k := r.Topic + "\x00" + string(r.Key)
			ln := s.lanes[k]
			if ln == nil {
				ln = &shareLane{key: k}
				s.lanes[k] = ln
			}
			rec.lane = ln
			if ln.active > 0 {
				ln.queue = append(ln.queue, rec)
				return
			}
			ln.active++
			rec.active = true
		}
		s.ready = append(s.ready, rec)
	})
	if n == 0 {
		return
	}
	s.polls.Add(1)
	s.received.Add(int64(n))
	if s.empty == nil && len(s.held) > 0 {
		s.empty = make(chan struct{})
	}
	s.cond.Broadcast()
}

// waitAcknowledged waits until every held record has its final
// acknowledgement, renewing the locks of the others meanwhile. It reports
// false when ctx ended first.
func (s *shareRun) waitAcknowledged(ctx context.Context) bool {
	s.mu.Lock()
	ch := s.empty
	tick := time.Second
	for r := range s.held {
		tick = min(tick, r.lockLen/4)
	}
	s.mu.Unlock()
	if ch == nil {
		return ctx.Err() == nil
	}
	t := time.NewTicker(max(tick, 5*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ch:
			return ctx.Err() == nil
		case <-ctx.Done():
			return false
		case now := <-t.C:
			s.renew(ctx, now)
		}
	}
}

// renew extends the acquisition locks that passed half their duration.
func (s *shareRun) renew(ctx context.Context, now time.Time) {
	var due []*kgo.Record
	lock := time.Duration(math.MaxInt64)
	s.mu.Lock()
	for r := range s.held {
		if !now.Before(r.renewAt) {
			r.renewAt = now.Add(r.lockLen / 2)
			due = append(due, r.t.Value.rec)
			lock = min(lock, r.lockLen)
		}
	}
	s.mu.Unlock()
	if len(due) == 0 {
		return
	}
	// A record acknowledged meanwhile keeps its final status: the client
	// renews only records with none.
	s.cl.MarkAcks(kgo.AckRenew, due...)
	s.renewed.Add(int64(len(due)))
	// The client sends acknowledgements with its next fetch, or after a
	// second: too late for a short lock. Send them now (the poller has
	// nothing else to do meanwhile).
	fctx, cancel := context.WithTimeout(ctx, min(lock/4, time.Second))
	_ = s.cl.FlushAcks(fctx)
	cancel()
}

func (s *shareRun) worker(ctx context.Context, slot int) {
	var (
		taken, accept []*shareRec
		recs          []*kgo.Record
		// perRecord estimates the handler's time per record. Until a
		// fast handler is measured, records are taken one at a time, so
		// a slow handler never sits on records another worker could run.
		perRecord = time.Hour
	)
	for {
		s.mu.Lock()
		for len(s.ready) == 0 && !s.stop {
			s.cond.Wait()
		}
		if s.stop {
			s.mu.Unlock()
			return
		}
		taken = s.takeLocked(taken[:0], perRecord)
		s.running += len(taken)
		s.mu.Unlock()

		start := time.Now()
		if s.bh != nil {
			accept = s.attempt(ctx, slot, taken, &recs, accept)
		} else {
			for i := range taken {
				accept = s.attempt(ctx, slot, taken[i:i+1], &recs, accept)
			}
		}
		took := time.Since(start) / time.Duration(len(taken))
		if perRecord > time.Minute {
			perRecord = took
		} else {
			perRecord = (perRecord*3 + took) / 4
		}
		s.mu.Lock()
		s.running -= len(taken)
		s.mu.Unlock()
		if len(accept) > 0 {
			s.accepted.Add(int64(len(accept)))
			s.settle(accept, kgo.AckAccept)
		}
		clear(taken)
		clear(accept)
		accept = accept[:0]
	}
}

// attempt runs the handler once on rs (one record, or a batch for a
// BatchHandler) with an attempt context the engine's watchdog cancels at
// AttemptTimeout, and returns accept with the records that succeeded
// appended; failed ones go to failed.
func (s *shareRun) attempt(ctx context.Context, slot int, rs []*shareRec, recs *[]*kgo.Record, accept []*shareRec) []*shareRec {
	now := time.Now()
	*recs = (*recs)[:0]
	for _, r := range rs {
		s.eng.dispatched(&r.t, now)
		*recs = append(*recs, r.t.Value.rec)
	}
	actx := &attemptCtx{Context: ctx, deadline: now.Add(s.cfg.attemptTimeout), task: &rs[0].t, attempt: rs[0].t.Value.attempts}
	s.eng.slots[slot].Store(actx)
	var err error
	if s.bh != nil {
		err = s.eng.callBatch(actx, *recs)
	} else {
		err = callHandler(actx, s.h, (*recs)[0])
	}
	s.eng.slots[slot].Store(nil)
	timedOut := err != nil && actx.timedOut()
	for _, r := range rs {
		backoff := s.eng.observe(&r.t, err)
		switch {
		case err == nil:
			accept = append(accept, r)
		case ctx.Err() != nil:
			// Hard stop: the record is released with the rest.
		default:
			s.failed(r, err, timedOut, backoff)
		}
	}
	clear(*recs)
	return accept
}

// takeLocked pops the next ready record and, for a fast Handler, a share of
// the others, or, for a BatchHandler, the records that may join it: its
// key's queued records (ByKey), or the next ready records of its partition
// without a lane. Called with mu held.
func (s *shareRun) takeLocked(batch []*shareRec, perRecord time.Duration) []*shareRec {
	first := s.ready[0]
	s.ready[0] = nil
	s.ready = s.ready[1:]
	batch = append(batch, first)
	if s.bh == nil {
		// A worker whose handler is fast takes its share of the ready
		// records at once, as the engine's do: the lock, not the
		// handler, dominates there.
		if perRecord < fastHandler {
			n := min(maxTake, (len(s.ready)+s.cfg.concurrency)/s.cfg.concurrency)
			for len(batch) < n && len(s.ready) > 0 {
				batch = append(batch, s.ready[0])
				s.ready[0] = nil
				s.ready = s.ready[1:]
			}
		}
		return batch
	}
	fr := first.t.Value.rec
	if ln := first.lane; ln != nil {
		for len(batch) < s.cfg.batchSize && len(ln.queue) > 0 {
			r := ln.queue[0]
			ln.queue = ln.queue[1:]
			r.active = true
			ln.active++
			batch = append(batch, r)
		}
		return batch
	}
	for len(batch) < s.cfg.batchSize && len(s.ready) > 0 {
		r := s.ready[0]
		if r.lane != nil || r.t.Value.rec.Topic != fr.Topic || r.t.Value.rec.Partition != fr.Partition {
			break
		}
		s.ready[0] = nil
		s.ready = s.ready[1:]
		batch = append(batch, r)
	}
	return batch
}

// failed applies the failure policy (nextStep) to a failed attempt: a
// retry after backoff while the record stays acquired, or the dead-letter
// sink. During shutdown a record to retry is released instead, unless it
// is on its last delivery.
func (s *shareRun) failed(r *shareRec, err error, timedOut bool, backoff time.Duration) {
	it := &r.t.Value
	noteFailure(it, err, timedOut, time.Now())
	step := s.cfg.nextStep(it, s.log)
	s.mu.Lock()
	if step == stepDeadLetter {
		s.dead = append(s.dead, r)
		s.mu.Unlock()
		select {
		case s.deadWake <- struct{}{}:
		default:
		}
		return
	}
	if s.closing && !r.last {
		s.mu.Unlock()
		s.settle([]*shareRec{r}, kgo.AckRelease)
		return
	}
	if step == stepRetryCapped {
		backoff = s.cfg.retryMax
	}
	if !s.stop {
		s.timers[r] = time.AfterFunc(backoff, func() {
			s.mu.Lock()
			if _, ok := s.timers[r]; !ok || s.stop {
				s.mu.Unlock()
				return
			}
			delete(s.timers, r)
			if s.closing && !r.last {
				s.mu.Unlock()
				s.settle([]*shareRec{r}, kgo.AckRelease)
				return
			}
			s.ready = append(s.ready, r)
			s.cond.Signal()
			s.mu.Unlock()
		})
	}
	s.mu.Unlock()
}

// deadLetterWriter writes failed records to the sink in batches and
// accepts them once the sink acknowledged them. Until then they stay
// acquired and unacknowledged. It runs until ctx (the hard stop) ends.
func (s *shareRun) deadLetterWriter(ctx context.Context) {
	writeQueued(ctx, s.deadWake, &s.mu, &s.dead, func(batch []*shareRec) bool {
		ts := tasksOf(batch, func(r *shareRec) *task { return &r.t })
		if !s.eng.deadLetterUntilAcked(ctx, ts, "the records stay acquired, unacknowledged, until it succeeds") {
			return false
		}
		s.deadLettered.Add(int64(len(batch)))
		s.accepted.Add(int64(len(batch)))
		s.settle(batch, kgo.AckAccept)
		return true
	})
}

// unstartedLocked takes the records that have not started (ready, queued
// behind their key, waiting for a retry) out of the pipeline for release,
// except those on their last delivery. Called with mu held.
func (s *shareRun) unstartedLocked() []*shareRec {
	var out []*shareRec
	s.ready, out = keepLast(s.ready, out)
	for _, ln := range s.lanes {
		ln.queue, out = keepLast(ln.queue, out)
	}
	for r, tm := range s.timers {
		if !r.last {
			tm.Stop()
			delete(s.timers, r)
			out = append(out, r)
		}
	}
	return out
}

// keepLast filters rs in place down to the records on their last delivery,
// returned first, and appends the others to out, returned second.
func keepLast(rs, out []*shareRec) ([]*shareRec, []*shareRec) {
	kept := rs[:0]
	for _, r := range rs {
		if r.last {
			kept = append(kept, r)
		} else {
			out = append(out, r)
		}
	}
	clear(rs[len(kept):])
	return kept, out
}

// settle gives records their final acknowledgement and takes them out of
// the pipeline: the next record of each one's key becomes ready (or, during
// shutdown, is released too).
func (s *shareRun) settle(rs []*shareRec, status kgo.AckStatus) {
	for len(rs) > 0 {
		recs := make([]*kgo.Record, len(rs))
		for i, r := range rs {
			recs[i] = r.t.Value.rec
		}
		// Before the record leaves held: the next poll must find the
		// final status set, or the client would accept it.
		s.cl.MarkAcks(status, recs...)
		if status == kgo.AckRelease {
			s.released.Add(int64(len(rs)))
		}
		var more []*shareRec
		s.mu.Lock()
		for _, r := range rs {
			if _, ok := s.held[r]; !ok {
				continue
			}
			delete(s.held, r)
			if ln := r.lane; ln != nil {
				if r.active {
					r.active = false
					ln.active--
				}
				more = s.advanceLaneLocked(ln, more)
			}
		}
		if len(s.held) == 0 && s.empty != nil {
			close(s.empty)
			s.empty = nil
		}
		s.mu.Unlock()
		rs, status = more, kgo.AckRelease
	}
}

// advanceLaneLocked makes the next queued record of ln ready once none of
// its records is active; during shutdown a record not on its last delivery
// is appended to release instead. Called with mu held.
func (s *shareRun) advanceLaneLocked(ln *shareLane, release []*shareRec) []*shareRec {
	for ln.active == 0 && len(ln.queue) > 0 {
		r := ln.queue[0]
		ln.queue[0] = nil
		ln.queue = ln.queue[1:]
		if s.closing && !r.last {
			release = append(release, r)
			continue
		}
		r.active = true
		ln.active++
		s.ready = append(s.ready, r)
		s.cond.Signal()
	}
	if ln.active == 0 && len(ln.queue) == 0 && s.lanes[ln.key] == ln {
		delete(s.lanes, ln.key)
	}
	return release
}

// onAcks is the client's ShareAckCallback: it counts and logs failed
// acknowledgements (their records are delivered again).
func (s *shareRun) onAcks(_ *kgo.Client, rs kgo.ShareAckResults) {
	for _, r := range rs {
		if r.Err != nil {
			s.ackErrors.Add(1)
			s.log.Warn("kpar: share acknowledgement failed; the broker delivers those records again",
				"topic", r.Topic, "partition", r.Partition, "err", r.Err)
		}
	}
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
