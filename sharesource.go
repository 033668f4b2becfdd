package kpar

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/window"
)

// shareSource is a share group member (KIP-932, see ShareGroup): a share
// client whose poller delivers acquired records, each partition's into a
// partState of its own, and whose settle acknowledges finished records
// (ACCEPT) and withdrawn ones (RELEASE), renewing the acquisition locks of
// the records it holds meanwhile.
type shareSource struct {
	e       *engine
	cfg     *cfg
	log     *slog.Logger
	cl      *kgo.Client // set by open, before any goroutine starts
	maxPoll int

	received, redelivered, polls atomic.Int64
	accepted, released, renewed  atomic.Int64
	ackErrors                    atomic.Int64
	live                         atomic.Bool // see ShareStats.Running
	maxDelivery, limit           atomic.Int32

	// mu guards the fields below. The poller takes it to hold and renew
	// records, the settler to let them go; never while holding
	// engine.mu.
	mu sync.Mutex
	// acquired holds every record polled and not acknowledged yet (its
	// ACCEPT or RELEASE not marked on the client), with its lock's
	// renewal.
	acquired map[*kgo.Record]*lease
	empty    chan struct{}       // closed when acquired becomes empty; nil while it is
	topics   map[string]struct{} // topics records came from, paused at shutdown
}

// lease is when an acquired record's lock is renewed next.
type lease struct {
	renewAt time.Time
	lockLen time.Duration
}

func newShareSource(e *engine) *shareSource {
	c := e.cfg
	s := &shareSource{
		e:   e,
		cfg: c,
		log: e.log,
		// Twice what the workers run at once: enough to keep them busy
		// across the handover to the next poll, little enough not to
		// sit on records other members could run.
		maxPoll:  min(2*c.concurrency*c.batchSize, 1<<15),
		acquired: make(map[*kgo.Record]*lease),
		topics:   make(map[string]struct{}),
	}
	s.limit.Store(defaultDeliveryLimit)
	return s
}

// defaultDeliveryLimit is Kafka's group.share.delivery.count.limit.
const defaultDeliveryLimit = 5

func (s *shareSource) snapshot() ShareStats {
	s.mu.Lock()
	st := ShareStats{Acquired: len(s.acquired)}
	s.mu.Unlock()
	e := s.e
	e.mu.Lock()
	_, _, dead := e.outcomes.Tally()
	st.InFlight, st.Retrying, st.DeadLettered = e.limits.Active(), e.retries.Waiting(), dead
	e.mu.Unlock()
	st.Group, st.Running = s.cfg.shareGroup, s.live.Load()
	st.Polls, st.Received, st.Redelivered = s.polls.Load(), s.received.Load(), s.redelivered.Load()
	st.MaxDeliveryCount, st.DeliveryLimit = s.maxDelivery.Load(), s.limit.Load()
	st.Accepted, st.Released = s.accepted.Load(), s.released.Load()
	st.Renewed, st.AckErrors = s.renewed.Load(), s.ackErrors.Load()
	return st
}

// clientOpts are the options of the share consumer's client; with admin
// set, of a plain client for the start-up checks.
func (s *shareSource) clientOpts(admin bool) []kgo.Opt {
	c := s.cfg
	opts := []kgo.Opt{
		kgo.WithLogger(kgoLogger(c.logger)),
	}
	// A group's fetch sizes (fetchsize.go): a broker that honours them
	// (Kafka does, kfake does not) bounds the acquired records waiting
	// for MaxBufferedBytes to about one fetch.
	_, _, sizes := fetchSizing(c.maxBytes)
	opts = append(append(opts, sizes...), c.clientOpts...)
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

func (s *shareSource) open(ctx context.Context) error {
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
	return nil
}

// deliver is the poller. It polls again only once every record of the
// last poll has its final acknowledgement: the client would accept the
// others at the next poll.
func (s *shareSource) deliver(ctx context.Context) error {
	s.live.Store(true)
	defer s.live.Store(false)
	flog := &fetchErrorLog{log: s.log}
	// A topic gone (deleted, or a development broker restarted in memory)
	// may have taken the group's configs with it: a share group that lost
	// share.auto.offset.reset=earliest would start the new topic at its
	// newest record and skip what was produced meanwhile.
	topics := topicWatch{cl: s.cl, log: s.log, regex: s.cfg.regex, hooks: s.e.hooks.topicUnavailable,
		forget: func(string) {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			s.prepareGroup(pctx, s.cl)
			cancel()
		}}
	for {
		if !s.waitAcknowledged(ctx) {
			return nil
		}
		fs := s.cl.PollRecords(ctx, s.maxPoll)
		if fs.IsClientClosed() {
			return nil
		}
		err := fatalFetchError(fs, flog, "share group: ")
		topics.observe(fs, time.Now())
		s.admit(fs)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// admit holds the records of one poll and hands them to the pipeline, a
// partition at a time, as far as MaxBufferedBytes admits them.
func (s *shareSource) admit(fs kgo.Fetches) {
	now := time.Now()
	limit := s.limit.Load()
	n := 0
	var last []*kgo.Record // on their last delivery: logged after the lock
	s.mu.Lock()
	fs.EachRecord(func(r *kgo.Record) {
		n++
		dc := r.DeliveryCount()
		if dc > 1 {
			s.redelivered.Add(1)
		}
		if dc > s.maxDelivery.Load() {
			s.maxDelivery.Store(dc) // only admit writes it
		}
		if limit > 0 && dc >= limit {
			last = append(last, r)
		}
		// The time left on the lock stands for its duration: the first
		// renewal comes early rather than late.
		lockLen := max(r.AcquisitionDeadline().Sub(now), 20*time.Millisecond)
		s.acquired[r] = &lease{renewAt: now.Add(lockLen / 2), lockLen: lockLen}
		s.topics[r.Topic] = struct{}{}
	})
	if n > 0 && s.empty == nil {
		s.empty = make(chan struct{})
	}
	s.mu.Unlock()
	for _, r := range last {
		s.log.Debug("kpar: record on its last delivery", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "delivery_count", r.DeliveryCount())
	}
	if n == 0 {
		return
	}
	s.polls.Add(1)
	s.received.Add(int64(n))
	e := s.e
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		meta := e.prepare(p.Records)
		e.mu.Lock()
		// Within MaxBufferedBytes: what it has no room for waits,
		// acquired and its lock renewed, until bytes free; the next poll
		// waits for every record of this one.
		e.acceptWithin(s.part(p.Topic, p.Partition), p.Records, meta, len(p.Records))
		e.mu.Unlock()
	})
}

// part returns the partState of a share partition, made at its first
// record. Its window orders records by arrival (window.NewAcquired): the
// broker may deliver records again below offsets it delivered before.
// Called with mu held.
func (s *shareSource) part(topic string, partition int32) *partState {
	e := s.e
	k := tp{topic: topic, partition: partition}
	ps := e.parts[k]
	if ps == nil {
		ps = &partState{tp: k, win: window.NewAcquired(e.cfg.windowRecords), committed: -1, resumeAt: -1}
		e.parts[k] = ps
	}
	return ps
}

// settle acknowledges the records that finished (ACCEPT) or were withdrawn
// (RELEASE) since the last settle, and lets them go.
func (s *shareSource) settle(context.Context) error {
	e := s.e
	e.mu.Lock()
	e.outcomes.Taken()
	accepted, released := e.outcomes.TakeAcks()
	e.mu.Unlock()
	s.ack(accepted, kgo.AckAccept)
	s.ack(released, kgo.AckRelease)
	return nil
}

// ack marks the final acknowledgement of rs and lets them go: once none is
// held, the poller polls again.
func (s *shareSource) ack(rs []*kgo.Record, status kgo.AckStatus) {
	if len(rs) == 0 {
		return
	}
	// Before the records leave acquired: the next poll must find their
	// final status set, or the client would accept them.
	s.cl.MarkAcks(status, rs...)
	if status == kgo.AckRelease {
		s.released.Add(int64(len(rs)))
	} else {
		s.accepted.Add(int64(len(rs)))
	}
	s.mu.Lock()
	for _, r := range rs {
		delete(s.acquired, r)
	}
	if len(s.acquired) == 0 && s.empty != nil {
		close(s.empty)
		s.empty = nil
	}
	s.mu.Unlock()
}

// settleEvery is 0: finished records are acknowledged at once. Marking an
// acknowledgement sends nothing (the client sends them with its next
// fetch, or within a second), and the poller polls again only once every
// record of its last poll is acknowledged: spacing the marks would pace
// the whole member (by 5ms a poll, a fifth of its throughput at noop).
func (s *shareSource) settleEvery() time.Duration { return 0 }

// pause does nothing: the poller takes no more than one poll's records,
// whatever the windows and MaxBufferedBytes hold; those they have no room
// for wait, acquired, until they have.
func (s *shareSource) pause(*partState, bool) {}

// keepAtShutdown reports whether r is on its last delivery, which a
// RELEASE would make the broker archive unseen: shutdown runs it rather
// than withdrawing it.
func (s *shareSource) keepAtShutdown(r *kgo.Record) bool {
	limit := s.limit.Load()
	return limit > 0 && r.DeliveryCount() >= limit
}

// stopping stops fetching and has the pipeline withdraw what did not start.
func (s *shareSource) stopping() {
	s.mu.Lock()
	topics := slices.Collect(maps.Keys(s.topics))
	s.mu.Unlock()
	// Fetch nothing more: the client would acquire the released records
	// again, burning a delivery of each, only to release them at leave.
	if !s.cfg.regex {
		topics = append(topics, s.cfg.topics...)
	}
	s.cl.PauseFetchTopics(topics...)
	s.log.Info("kpar: stopping: releasing records not started, finishing the others", "timeout", s.cfg.shutdownTimeout)
	s.e.withdrawAll()
}

// close acknowledges what the last settle left, releases what is still
// held (records the shutdown timeout cut off), flushes the
// acknowledgements and leaves the group, by deadline.
func (s *shareSource) close(ctx context.Context, deadline time.Time) error {
	_ = s.settle(ctx)
	limit := s.limit.Load()
	s.mu.Lock()
	left := slices.Collect(maps.Keys(s.acquired))
	s.mu.Unlock()
	for _, r := range left {
		if limit > 0 && r.DeliveryCount() >= limit {
			s.log.Error("kpar: a record on its last delivery was not finished by the shutdown timeout; the broker archives it when it is released",
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
		}
	}
	if len(left) > 0 {
		s.log.Warn("kpar: shutdown timeout passed with records unfinished; releasing them, they will be delivered again", "unfinished", len(left))
		s.ack(left, kgo.AckRelease)
	}
	var last error
	leaveWithin(ctx, s.cl, deadline, s.log, "the broker releases this member's records when their locks expire", func(cctx context.Context) {
		if last = s.cl.FlushAcks(cctx); last != nil {
			s.log.Warn("kpar: flushing acknowledgements timed out; the broker redelivers those it did not get when their locks expire", "err", last)
		}
	})
	return last
}

// waitAcknowledged waits until every acquired record has its final
// acknowledgement, renewing the locks of the others meanwhile. It reports
// false when ctx ended first.
func (s *shareSource) waitAcknowledged(ctx context.Context) bool {
	s.mu.Lock()
	ch := s.empty
	tick := time.Second
	for _, l := range s.acquired {
		tick = min(tick, l.lockLen/4)
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
func (s *shareSource) renew(ctx context.Context, now time.Time) {
	var due []*kgo.Record
	lock := time.Duration(math.MaxInt64)
	s.mu.Lock()
	for r, l := range s.acquired {
		if !now.Before(l.renewAt) {
			l.renewAt = now.Add(l.lockLen / 2)
			due = append(due, r)
			lock = min(lock, l.lockLen)
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

// onAcks is the client's ShareAckCallback: it counts and logs failed
// acknowledgements (their records are delivered again).
func (s *shareSource) onAcks(_ *kgo.Client, rs kgo.ShareAckResults) {
	for _, r := range rs {
		if r.Err != nil {
			s.ackErrors.Add(1)
			s.log.Warn("kpar: share acknowledgement failed; the broker delivers those records again",
				"topic", r.Topic, "partition", r.Partition, "err", r.Err)
		}
	}
}
