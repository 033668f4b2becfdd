package kpar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// groupSource is a consumer group member: a client whose poller delivers
// records into partition windows, whose commits settle them (commit.go)
// and whose rebalances hand partitions in and out (rebalance.go).
type groupSource struct {
	e  *engine
	cl *kgo.Client // set by open, before any goroutine starts

	// commitMu serialises commits from snapshot to response (commit.go):
	// the settler's, a revoke's, the final one. Taken before engine.mu,
	// never while holding it.
	commitMu sync.Mutex
	// joined is set once the group gave this member an assignment (empty
	// or not) in this run.
	joined atomic.Bool
	// refusal ends the run of a member of another ordering mode than the
	// group's (ordering.go).
	refusal refusal
	// joins ends the run of a member that keeps failing to join (the
	// poller's).
	joins joinFailures
	// unknown is the transaction whose outcome the broker has not told
	// yet, nil for none: nothing commits until it does (txn.go). Guarded
	// by commitMu.
	unknown *unknownTxn
	// renewals counts the transactional producers renewed since a
	// transaction last committed (txnrenew.go). Guarded by commitMu.
	renewals int
	// ids caches topic IDs for transactional commits (topicids.go).
	ids topicIDCache
	// budgetSpacing is the spacing between commits the member's share of
	// the group's CommitBudget asks for, in nanoseconds (budget.go).
	budgetSpacing atomic.Int64
	// shareStale asks the settler to learn the member's quota of the
	// commit budget again (learnQuota, budget.go): the
	// assignment changed. The rebalance callbacks only set it, so that no
	// metadata request delays a rebalance.
	shareStale atomic.Bool
	// lost keeps what was finished on partitions lost without a commit,
	// for when they come back (lostwork.go).
	lost lostWork
	// inTxn is the records whose outputs the transaction in flight holds
	// (txn.go), for what a loss keeps (lostwork.go), and txnEnded is
	// closed once the latest transaction with outputs ended and gave back
	// what it held of lost partitions. Guarded by engine.mu.
	inTxn    []outputInTxn
	txnEnded chan struct{}
	// sizer shrinks the fetch sizes by the records' compression
	// (fetchsize.go).
	sizer fetchSizer
}

func newGroupSource(e *engine) *groupSource {
	return &groupSource{e: e}
}

func (g *groupSource) open(ctx context.Context) error {
	cl, err := kgo.NewClient(g.clientOpts()...)
	if err != nil {
		return fmt.Errorf("kpar: creating the client: %w", err)
	}
	// Fail fast on what retrying cannot fix (bad credentials, missing
	// permissions): the group loop would otherwise retry it silently.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = cl.Ping(pctx)
	cancel()
	if err != nil && isFatal(err) {
		cl.Close()
		return fmt.Errorf("kpar: connecting to the brokers: %w", err)
	}
	g.cl = cl
	g.sizer.start(cl)
	g.e.createRetryTopics(ctx, cl)
	return nil
}

func (g *groupSource) settle(ctx context.Context) error {
	if g.shareStale.Swap(false) {
		g.learnQuota(ctx)
	}
	err := g.commit(ctx, nil)
	g.heartbeatIfForgotten(err) // forgotten.go
	return err
}

// settleEvery is CommitInterval, or longer while the member's share of
// the group's commit budget asks for more (budget.go).
func (g *groupSource) settleEvery() time.Duration {
	return max(g.e.cfg.commitInterval, time.Duration(g.budgetSpacing.Load()))
}

func (g *groupSource) pause(ps *partState, paused bool) {
	parts := map[string][]int32{ps.topic: {ps.partition}}
	if paused {
		g.cl.PauseFetchPartitions(parts)
	} else {
		g.cl.ResumeFetchPartitions(parts)
	}
}

func (g *groupSource) stopping() {}

// close commits what finished and leaves the group, by deadline. A member
// that never joined (its JoinGroup still waits for the group's other
// members, a dead one's session timeout say) has nothing to commit and
// nothing to hand over: it waits for its leave no more than a second, not
// the whole shutdown timeout.
func (g *groupSource) close(ctx context.Context, deadline time.Time) error {
	e := g.e
	unleft := "the group waits for the session timeout before moving its partitions"
	if !g.joined.Load() {
		unleft = "this member was still joining the group; the group goes on without it once its join ends"
		if soon := time.Now().Add(time.Second); soon.Before(deadline) {
			deadline = soon
		}
	}
	var last error
	leaveWithin(ctx, g.cl, deadline, e.log, unleft, func(cctx context.Context) {
		if last = g.commit(cctx, nil); last != nil {
			e.log.Warn("kpar: final commit failed; records after the last commit will be delivered again", "err", last)
		}
	})
	return last
}

func (g *groupSource) clientOpts() []kgo.Opt {
	e := g.e
	var fetchOpts []kgo.Opt
	g.sizer.fetch, g.sizer.part, fetchOpts = fetchSizing(e.cfg.maxBytes)
	defaults := append([]kgo.Opt{
		// Resuming a paused partition takes effect with the next fetch,
		// and a fetch in flight for partitions with no new data waits
		// FetchMaxWait first. kpar bench noop, one run: 100ms left the
		// tail of a backlog stalled (unordered 0.69x raw, partition 0.61x),
		// 25ms did not (0.73x, 0.87x). The cost is up to 40 empty fetches a
		// second per broker when idle; override with ClientOptions.
		kgo.FetchMaxWait(25 * time.Millisecond),
		kgo.WithHooks(&g.sizer),
	}, fetchOpts...) // the client's buffered fetches are memory too
	if e.cfg.protocol == ClassicProtocol {
		// Members that order differently must not share a group: see
		// orderedBalancer. (Both protocols also check the ordering in the
		// commit metadata: ordering.go.)
		defaults = append(defaults, kgo.Balancers(orderedBalancer{kgo.CooperativeStickyBalancer(), e.cfg.ordering}))
	}
	return e.cfg.groupClientOpts(defaults, e.retryTo.Consumed(),
		kgo.OnPartitionsAssigned(g.onAssigned),
		kgo.OnPartitionsRevoked(g.onRevoked),
		kgo.OnPartitionsLost(g.onLost),
		kgo.WithHooks(brokerBack{e}), // forgotten.go
	)
}

// groupClientOpts builds the options of a group member's client, for the
// engine and RunMembers alike. The order matters: kpar's defaults first, so
// ClientOptions override them; then what kpar owns and New checked nobody
// else sets (seeds, group, topics, manual commits), then the caller's own.
func (c *cfg) groupClientOpts(defaults []kgo.Opt, topics []string, owned ...kgo.Opt) []kgo.Opt {
	opts := append([]kgo.Opt{
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.WithLogger(kgoLogger(c.logger)),
	}, defaults...)
	opts = append(opts, c.clientOpts...)
	if len(c.brokers) > 0 {
		opts = append(opts, kgo.SeedBrokers(c.brokers...))
	}
	opts = append(opts,
		kgo.ConsumerGroup(c.group),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
	)
	if c.instanceID != "" {
		opts = append(opts, kgo.InstanceID(c.instanceID))
	}
	if c.exactlyOnce {
		// Outputs of transactions that abort must not be read back.
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	if c.protocol == ConsumerProtocol {
		// franz-go speaks KIP-848 with its own sticky (or range) balancer
		// only, and falls back to the classic protocol on a broker that
		// does not speak it.
		opts = append(opts, kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer())
	}
	if c.regex {
		opts = append(opts, kgo.ConsumeRegex())
	}
	return append(opts, owned...)
}

// deliver is the poller: the only caller of PollFetches. It returns nil when ctx ends and
// an error when the client reports a fatal one.
func (g *groupSource) deliver(ctx context.Context) error {
	e := g.e
	ctx = g.refusal.watch(ctx)
	fetchLog := fetchErrorLog{log: e.log}
	topics := topicWatch{cl: g.cl, log: e.log, regex: e.cfg.regex, hooks: e.hooks.topicUnavailable, forget: g.forgetTopic}
	for {
		if !e.waitForBytes(ctx) {
			return g.refusal.error()
		}
		fs := g.cl.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			return g.refusal.error()
		}
		if err := fatalFetchError(fs, &fetchLog, ""); err != nil {
			if errors.Is(err, ErrOrderingMismatch) {
				err = g.nameModes(ctx, err)
			}
			return err
		}
		if err := g.joins.observe(fs, e.cfg); err != nil {
			return err
		}
		topics.observe(fs, time.Now())
		g.admit(fs)
		g.sizer.adjust(g.cl)
	}
}

// joinFailures counts the consecutive polls whose only news is that the
// member failed to join its group with an error that means the group runs
// the other protocol: a member of the consumer protocol gets
// GROUP_ID_NOT_FOUND from a broker that does not migrate a classic group to
// it (KIP-848's online migration), a classic one UNKNOWN_MEMBER_ID from one
// that does not take classic members into a consumer group. Left alone the
// member retries forever, handling nothing. It belongs to the poller.
type joinFailures struct {
	n   int
	err error
}

// joinFailuresFatal is how many polls in a row, each after franz-go's
// growing backoff between joins (about 5s in all), end the member.
const joinFailuresFatal = 6

// observe notes a poll, and returns an error once the member has failed
// to join joinFailuresFatal times in a row.
func (j *joinFailures) observe(fs kgo.Fetches, c *cfg) error {
	failed, records := false, false
	fs.EachError(func(topic string, _ int32, err error) {
		if topic != "" {
			return
		}
		if (c.protocol == ConsumerProtocol && errors.Is(err, kerr.GroupIDNotFound)) ||
			(c.protocol == ClassicProtocol && errors.Is(err, kerr.UnknownMemberID)) {
			failed, j.err = true, err
		}
	})
	fs.EachPartition(func(p kgo.FetchTopicPartition) { records = records || len(p.Records) > 0 })
	if records || !failed {
		j.n = 0
		return nil
	}
	if j.n++; j.n < joinFailuresFatal {
		return nil
	}
	other := ClassicProtocol
	if c.protocol == ClassicProtocol {
		other = ConsumerProtocol
	}
	return fmt.Errorf("kpar: member of group %q cannot join it with the %s protocol (%v, %d times in a row): its members most likely use the %s protocol, and the broker does not mix them; use one GroupProtocol (kpar forward --group-protocol) for every member of a group",
		c.group, c.protocol, j.err, j.n, other)
}

// admit hands polled records to the pipeline, a partition at a time. The
// pipeline's lock is taken per partition, and each partition's records
// prepared before it, so workers finishing records wait for one
// partition's worth of bookkeeping at most, not a whole fetch's.
func (g *groupSource) admit(fs kgo.Fetches) {
	e := g.e
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		if level := e.retryTo.LevelOf(p.Topic); level > 0 {
			g.checkRetryHeaders(p.Records, level)
		}
		recs, meta := p.Records, e.prepare(p.Records)
		e.mu.Lock()
		resetFrom, resetTo := g.admitPartition(p, recs, meta)
		e.mu.Unlock()
		if resetTo >= 0 {
			// The committed offset was out of range (beyond the log after
			// a topic was recreated, or below its start after retention)
			// and the client reset to ConsumeResetOffset.
			e.log.Warn("kpar: committed offset out of range; consuming from the reset offset instead",
				"topic", p.Topic, "partition", p.Partition, "committed", resetFrom, "reset_to", resetTo)
		}
	})
}

// admitPartition accepts the records of one polled partition it owns,
// those above what it admitted already, and reports an offset reset it
// noticed (resetTo -1 for none). Called with mu held.
func (g *groupSource) admitPartition(p kgo.FetchTopicPartition, recs []*kgo.Record, meta []recMeta) (resetFrom, resetTo int64) {
	e := g.e
	resetTo = -1
	ps := e.parts[tp{topic: p.Topic, partition: p.Partition}]
	if ps == nil || ps.status != live {
		return 0, -1 // not ours (any more): the owner fetches them again
	}
	// Offsets only grow within an assignment; older ones mean the client
	// rewound (an offset reset). Records already admitted are done or
	// still tracked, so skipping them loses nothing.
	last := ps.win.End() - 1
	if ps.over.Len() > 0 {
		last = ps.over.lastOffset()
	} else if ps.held.Len() > 0 {
		last = ps.held.lastOffset()
	}
	for len(meta) > 0 && meta[0].offset <= last {
		recs, meta = recs[1:], meta[1:]
	}
	if len(meta) == 0 {
		return 0, -1
	}
	if ps.committed < 0 {
		// Commit the first window start even before anything finishes:
		// a crash then resumes here, not wherever ConsumeResetOffset
		// points.
		e.askCommit()
	}
	if ps.resumeAt >= 0 {
		if first := meta[0].offset; first < ps.resumeAt {
			resetFrom, resetTo = ps.resumeAt, first
		}
		ps.resumeAt = -1
	}
	if ps.firstAdmitted < 0 {
		ps.firstAdmitted = meta[0].offset
	}
	e.acceptWithin(ps, recs, meta, len(p.Records))
	return resetFrom, resetTo
}

// checkRetryHeaders logs, outside the pipeline's lock, the records of a
// retry topic whose kpar headers do not decode: they are handled as they
// are (enter decodes them again, quietly).
func (g *groupSource) checkRetryHeaders(recs []*kgo.Record, level int) {
	for _, r := range recs {
		var it item
		it.rec = r
		if err := decodeRetry(&it, level); err != nil {
			g.e.log.Warn("kpar: retry-topic record with bad kpar headers; handling it now as it is",
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
		}
	}
}
