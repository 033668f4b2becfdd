package kpar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// membersPollRecords bounds the records one member takes per poll. Commits
// happen after each poll and rebalances wait for the poll's records to be
// handled, so this also bounds how long a member holds up a rebalance:
// 500 records is Kafka's own max.poll.records default.
const membersPollRecords = 500

// RunMembers runs n members of one consumer group in this process — the
// classic "one consumer per goroutine" model — and blocks until ctx is
// cancelled or a member fails fatally.
//
// Each member is its own franz-go client built from the same options.
// RunMembers takes the MemberOpt options only — Group, Topics, TopicRegex,
// InstanceID, GroupProtocol and the Opt ones valid everywhere (Brokers, ClientOptions, RetryBackoff,
// ShutdownTimeout, WithLogger, WithHooks) — so passing one it would ignore,
// such as Concurrency, does not compile. A member handles
// its records one at a time, in offset order, and commits after handling
// the records of each poll (at most 500), so no offset is ever committed
// before its record was handled. Rebalances wait for a member's current
// poll to be handled and committed. A failed attempt (error or panic) is
// retried in place after a RetryBackoff delay: the partition waits for it.
// When ctx is cancelled, each member finishes its current record (its
// handler context stays valid for up to ShutdownTimeout), commits what it
// handled and leaves the group.
//
// Throughput is bounded by one record at a time per member, and a member
// with no partition sits idle: use n <= the number of partitions. Consumer
// (New and Run) instead runs many records per partition at once. Hooks for
// dispatch, completion, failures, commits, commit requests, assignments
// and revocations are called; pause and resume never happen.
//
// RunMembers returns nil after a clean shutdown, or the first fatal error
// (such as an authentication failure), after every member has stopped.
func RunMembers(ctx context.Context, n int, h Handler, opts ...MemberOpt) error {
	if n < 1 || n > 1<<10 {
		return fmt.Errorf("kpar: RunMembers(n=%d) out of range: want 1 to 1024", n)
	}
	if h == nil {
		return errNilHandler
	}
	c := defaultCfg()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if err := c.validate(); err != nil {
		return err
	}
	hk := newHooks(c.hooks)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	news := newGoneNews()
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error // guarded by errMu
	)
	for i := range n {
		wg.Go(func() {
			m := &member{cfg: &c, hooks: &hk, handler: h, id: i, news: news}
			if err := m.run(ctx); err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
				cancel() // one member failing fatally stops the others
			}
		})
	}
	wg.Wait()
	return firstErr
}

// member is one group member of RunMembers. Its fields are owned by its run
// goroutine, except what the rebalance callbacks touch (none).
type member struct {
	cfg     *cfg
	hooks   *hooks
	handler Handler
	id      int
	news    *goneNews // shared by the members
	cl      *kgo.Client
}

func (m *member) clientOpts() []kgo.Opt {
	// A poll's records are handled and committed before a rebalance may
	// move their partitions: no commit for a partition we lost, and the
	// next owner starts where we stopped.
	opts := m.cfg.groupClientOpts(nil, m.cfg.topics, kgo.BlockRebalanceOnPoll())
	if m.cfg.instanceID != "" {
		// One ID per member: members sharing an ID would fence each other.
		opts = append(opts, kgo.InstanceID(fmt.Sprintf("%s-%d", m.cfg.instanceID, m.id)))
	}
	if len(m.hooks.assigned) > 0 {
		opts = append(opts, kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			for _, h := range m.hooks.assigned {
				h.OnPartitionsAssigned(a)
			}
		}))
	}
	if len(m.hooks.revoked) > 0 {
		opts = append(opts,
			kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
				for _, h := range m.hooks.revoked {
					h.OnPartitionsRevoked(r, false)
				}
			}),
			kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, l map[string][]int32) {
				for _, h := range m.hooks.revoked {
					h.OnPartitionsRevoked(l, true)
				}
			}),
		)
	}
	return opts
}

func (m *member) run(ctx context.Context) error {
	cl, err := kgo.NewClient(m.clientOpts()...)
	if err != nil {
		return fmt.Errorf("kpar: member %d: creating the client: %w", m.id, err)
	}
	m.cl = cl
	defer cl.CloseAllowingRebalance()

	// Handlers keep running after ctx ends, for up to ShutdownTimeout.
	hctx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()
	stopTimer := context.AfterFunc(ctx, func() {
		t := time.NewTimer(m.cfg.shutdownTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			hardStop()
		case <-hctx.Done(): // run returned
		}
	})
	defer stopTimer()

	fetchLog := fetchErrorLog{log: m.cfg.logger}
	// Commits are synchronous, so nothing of a gone topic is left to
	// commit when the watch purges it: no forget callback.
	topics := topicWatch{cl: cl, log: m.cfg.logger, regex: m.cfg.regex, hooks: m.hooks.topicUnavailable,
		announce: m.news.announce}
	var seen uint64 // announcements of gone topics acted on
	for {
		// Between polls, the previous poll handled and committed: a safe
		// point to re-subscribe to a topic another member found gone. An
		// announcement during the poll ends it early, to get here.
		heard, now, wake := m.news.since(seen)
		seen = now
		for _, topic := range heard {
			topics.heard(topic, time.Now())
		}
		pctx, endPoll := context.WithCancel(ctx)
		stopWake := context.AfterFunc(wake, endPoll)
		fs := cl.PollRecords(pctx, membersPollRecords)
		stopWake()
		endPoll()
		if fs.IsClientClosed() || ctx.Err() != nil {
			cl.AllowRebalance()
			return nil
		}
		fatal := fatalFetchError(fs, &fetchLog, fmt.Sprintf("member %d: ", m.id), "member", m.id)
		if fatal != nil {
			cl.AllowRebalance()
			return fatal
		}
		done := m.handle(ctx, hctx, fs)
		m.commit(ctx, done)
		cl.AllowRebalance()
		topics.observe(fs, time.Now())
		if ctx.Err() != nil {
			return nil
		}
	}
}

// handle runs the handler on the poll's records, partition by partition in
// offset order, and returns the offset to commit for each partition: the
// one after its last handled record. It stops early once ctx ends.
func (m *member) handle(ctx, hctx context.Context, fs kgo.Fetches) map[string]map[int32]kgo.EpochOffset {
	done := make(map[string]map[int32]kgo.EpochOffset)
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		for _, r := range p.Records {
			if ctx.Err() != nil || !m.handleOne(ctx, hctx, r) {
				return
			}
			if done[r.Topic] == nil {
				done[r.Topic] = make(map[int32]kgo.EpochOffset)
			}
			done[r.Topic][r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
		}
	})
	return done
}

// handleOne runs the handler on r until an attempt succeeds. It reports
// false when it gave up because ctx ended first.
func (m *member) handleOne(ctx, hctx context.Context, r *kgo.Record) bool {
	for attempt := 1; ; attempt++ {
		for _, h := range m.hooks.dispatched {
			h.OnRecordDispatched(r, attempt)
		}
		start := time.Now()
		err := callHandler(hctx, m.handler, r)
		if err == nil {
			for _, h := range m.hooks.done {
				h.OnRecordDone(r, attempt, time.Since(start))
			}
			return true
		}
		backoff := m.cfg.backoff(attempt)
		if d, ok := retryAfter(err); ok {
			backoff = max(d, time.Millisecond)
		}
		attrs := []any{"member", m.id, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
			"attempt", attempt, "retry_in", backoff, "err", err}
		if pe, ok := err.(*PanicError); ok {
			attrs = append(attrs, "stack", string(pe.Stack))
		}
		m.cfg.logger.Warn("kpar: handler failed", attrs...)
		for _, h := range m.hooks.failed {
			h.OnAttemptFailed(r, attempt, err, backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// commit commits the handled offsets synchronously. After ctx ended (the
// shutdown path) it still commits, bounded by ShutdownTimeout.
func (m *member) commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) {
	if len(offsets) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.shutdownTimeout)
	defer cancel()
	asked := make(map[string]map[int32]int64, len(offsets))
	for t, ps := range offsets {
		asked[t] = make(map[int32]int64, len(ps))
		for p, eo := range ps {
			asked[t][p] = eo.Offset
		}
	}
	var reqParts, reqBytes int
	if len(m.hooks.commitReq) > 0 {
		cctx = kgo.PreCommitFnContext(cctx, func(req *kmsg.OffsetCommitRequest) error {
			for _, t := range req.Topics {
				reqParts += len(t.Partitions)
			}
			reqBytes = commitRequestBytes(req)
			return nil
		})
	}
	var commitErr error
	m.cl.CommitOffsetsSync(cctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			commitErr = err
			asked = nil
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					commitErr = errors.Join(commitErr, fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err))
					delete(asked[t.Topic], p.Partition)
				}
			}
		}
	})
	if commitErr != nil {
		m.cfg.logger.Warn("kpar: commit failed; the records of this poll will be delivered again", "member", m.id, "err", commitErr)
	}
	for _, h := range m.hooks.commit {
		h.OnCommit(asked, commitErr)
	}
	for _, h := range m.hooks.commitReq {
		h.OnCommitRequest(reqParts, reqBytes, commitErr)
	}
}
