package kpar

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/limit"
	"github.com/kpar/kpar/internal/sched"
)

var errNilHandler = errors.New("kpar: nil handler: pass a Handler (or HandlerFunc) to New")

// engine is one Run: the client, the poller, the workers and the committer.
type engine struct {
	// Set by newEngine (cl by run), read-only afterwards.
	cfg        *cfg
	handler    Handler
	batch      BatchHandler
	hooks      *hooks
	log        *slog.Logger
	seed       maphash.Seed
	stuckAfter time.Duration

	slots   attemptSlots // each worker's running attempt, for the watchdog
	overdue atomic.Int64 // attempts running past their deadline at the last scan

	cl *kgo.Client // set once in run before any goroutine starts

	// The fields above are read by every worker outside the lock; the
	// lock's word and what it guards change with every record.
	_ [falseSharingPad]byte

	// mu guards the fields below up to commitMu, and the partStates in
	// parts. It is held for bookkeeping only: no client call, handler or
	// hook runs under it. Order: commitMu, then mu.
	mu    sync.Mutex
	cond  sync.Cond // workers wait here for ready records or stop
	ready sched.Queue[item]
	parts map[tp]*partState
	// idle counts the workers waiting on cond that no wake-up is on its
	// way to; waking is set from a Signal until the signalled worker runs
	// (see wake).
	idle   int
	waking bool
	// awake caps the awake workers while the handler is cheap (awake.go).
	awake   awakeState
	bytes   int64 // recordSize of buffered records, but those waiting on retry timers
	pending int   // admitted records not finished, over live partitions
	timers  map[*task]*time.Timer
	// taskPool is the free task chunks of the windows' taskStores.
	taskPool taskPool
	stop     bool // workers exit; timers do not fire
	// running holds the record each worker runs now, for stuck reports
	// (fast records share one attempt context, so a worker's attempt slot
	// does not say which record runs), and the stuck guard's tick when it
	// took it (awake.go). A worker sets its own in the lock round trip
	// that takes the record: no atomic per record.
	running []slotRecord
	// pollWait is set while the poller waits for buffered bytes to drop
	// below MaxBufferedBytes; space wakes it.
	pollWait bool
	space    chan struct{}
	// exiled records wait for the exile writer (retry topic or dead-letter
	// sink); exileWake nudges it.
	exiled    []*task
	exileWake chan struct{}
	// lim is the adaptive in-flight limit (AdaptiveConcurrency), nil when
	// off; active counts records taken by workers and not finished, which
	// it bounds; limitWake is armed while the limit pauses dispatching.
	lim       *limit.Adaptive
	active    int
	limitWake *time.Timer
	// rate holds the rate limits (throttle.go), nil when none; brk is the
	// overload breaker (overload.go), nil with the adaptive limit, which
	// paces an overloaded downstream itself; over summarises overload logs.
	rate *rates
	// wideOK: key and unordered modes may use wide lanes (widelane.go);
	// set by newEngine.
	wideOK bool
	// runOK: records may enter as record runs (run.go), neither a batch
	// handler, nor a rate limit, nor the adaptive limit counting records
	// one by one; set by newEngine.
	runOK bool
	// runsEntered counts the record runs entered, for tests. Guarded by mu.
	runsEntered uint64
	brk         *limit.Breaker
	over        overloadLog
	// toggles are pause/resume decisions for the fetch controller
	// (poll.go); toggleWake (capacity 1) wakes it.
	toggles    []fetchToggle
	toggleWake chan struct{}
	// commitAsked is set when a record finished since the committer last
	// took a snapshot; commitWake (capacity 1) wakes the committer.
	commitAsked bool
	commitWake  chan struct{}
	// commitMu serialises commits from snapshot to response (commit.go). It
	// is taken before mu, never while holding it.
	commitMu sync.Mutex
	// closing is set when shutdown begins: revokes from then on (leaving
	// the group) do not wait for running records, the drain did.
	closing atomic.Bool
	// drained is closed when pending reaches 0 after draining began.
	draining bool
	drained  chan struct{}
}

// falseSharingPad separates what different goroutines write: two cache
// lines, since CPUs fetch lines in adjacent pairs.
const falseSharingPad = 128

func newEngine(c *Consumer) *engine {
	e := &engine{
		cfg:     &c.cfg,
		handler: c.handler,
		batch:   c.batch,
		hooks:   &c.hooks,
		log:     c.cfg.logger,
		seed:    maphash.MakeSeed(),
		parts:   make(map[tp]*partState),
		timers:  make(map[*task]*time.Timer),
		space:   make(chan struct{}, 1),
		slots:   make(attemptSlots, c.cfg.concurrency),
		running: make([]slotRecord, c.cfg.concurrency),
		awake:   newAwakeState(),

		exileWake:  make(chan struct{}, 1),
		commitWake: make(chan struct{}, 1),
		toggleWake: make(chan struct{}, 1),
		stuckAfter: c.cfg.stuckAfter,
	}
	if e.stuckAfter == 0 {
		e.stuckAfter = 2 * c.cfg.attemptTimeout
	}
	e.cond.L = &e.mu
	if c.cfg.adaptive {
		e.lim = limit.New(c.cfg.concurrency)
	} else {
		e.brk = new(limit.Breaker)
	}
	e.rate = newRates(&c.cfg)
	e.wideOK = e.wideLanes()
	e.runOK = e.batch == nil && e.rate == nil && e.lim == nil
	e.awake.pinned = c.cfg.pinnedCost
	return e
}

func (e *engine) clientOpts() []kgo.Opt {
	defaults := []kgo.Opt{
		// Resuming a paused partition takes effect with the next fetch,
		// and a fetch in flight for partitions with no new data waits
		// FetchMaxWait first. kpar bench noop, one run: 100ms left the
		// tail of a backlog stalled (unordered 0.69x raw, partition 0.61x),
		// 25ms did not (0.73x, 0.87x). The cost is up to 40 empty fetches a
		// second per broker when idle; override with ClientOptions.
		kgo.FetchMaxWait(25 * time.Millisecond),
		// The client's buffered fetches are memory too: keep them within
		// a quarter of MaxBufferedBytes instead of franz-go's 50 MiB.
		kgo.FetchMaxBytes(int32(max(min(e.cfg.maxBytes/4, 50<<20), 1<<20))),
		// Members that order differently must not share a group: see
		// orderedBalancer.
		kgo.Balancers(orderedBalancer{kgo.CooperativeStickyBalancer(), e.cfg.ordering}),
	}
	return e.cfg.groupClientOpts(defaults, e.consumedTopics(),
		kgo.OnPartitionsAssigned(e.onAssigned),
		kgo.OnPartitionsRevoked(e.onRevoked),
		kgo.OnPartitionsLost(e.onLost),
	)
}

// groupClientOpts builds the options of a group member's client, for the
// engine and RunMembers alike. The order matters: kpar's defaults first, so
// ClientOptions override them; then what kpar owns and New checked nobody
// else sets (seeds, group, topics, manual commits), then the caller's own.
func (c *cfg) groupClientOpts(defaults []kgo.Opt, topics []string, owned ...kgo.Opt) []kgo.Opt {
	opts := append([]kgo.Opt{
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.WithLogger(kgoLogger{L: c.logger}),
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
	if c.regex {
		opts = append(opts, kgo.ConsumeRegex())
	}
	return append(opts, owned...)
}

func (e *engine) run(ctx context.Context) error {
	cl, err := kgo.NewClient(e.clientOpts()...)
	if err != nil {
		return fmt.Errorf("kpar: creating the client: %w", err)
	}
	e.cl = cl
	// Fail fast on what retrying cannot fix (bad credentials, missing
	// permissions): the group loop would otherwise retry it silently.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = cl.Ping(pctx)
	cancel()
	if err != nil && isFatal(err) {
		cl.Close()
		return fmt.Errorf("kpar: connecting to the brokers: %w", err)
	}

	// Handlers keep running while Run drains; this context is cancelled
	// only when the drain times out, or after Run is done.
	hctx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()

	e.createRetryTopics(ctx)

	var workers sync.WaitGroup
	for i := range e.cfg.concurrency {
		workers.Go(func() { e.worker(hctx, i) })
	}
	var exiles sync.WaitGroup
	if e.cfg.deadLetters != nil || len(e.cfg.retryTopics) > 0 {
		exiles.Go(func() { e.exileWriter(hctx) })
	}
	commitCtx, stopCommitter := context.WithCancel(context.WithoutCancel(ctx))
	var committer sync.WaitGroup
	committer.Go(func() { e.committer(commitCtx) })
	committer.Go(func() { e.fetchController(commitCtx) })
	committer.Go(func() { e.watchdog(commitCtx, hctx.Done()) })

	pollCtx, stopPoll := context.WithCancel(ctx)
	pollDone := make(chan error, 1)
	go func() { pollDone <- e.poll(pollCtx) }()

	var runErr error
	select {
	case <-ctx.Done():
		stopPoll()
		runErr = <-pollDone
	case runErr = <-pollDone:
		stopPoll()
	}
	e.log.Info("kpar: stopping: draining buffered records", "timeout", e.cfg.shutdownTimeout)

	// The whole shutdown fits in ShutdownTimeout: the drain gets it but a
	// reserve, and the reserve covers the workers' exit, the final commit
	// and leaving the group.
	deadline := time.Now().Add(e.cfg.shutdownTimeout)
	reserve := min(e.cfg.shutdownTimeout/5, 2*time.Second)
	e.closing.Store(true)
	drained := e.drain(time.Until(deadline.Add(-reserve)))
	e.mu.Lock()
	e.stop = true
	e.stopGuard()
	if e.limitWake != nil {
		e.limitWake.Stop()
		e.limitWake = nil
	}
	for t, tm := range e.timers {
		tm.Stop()
		delete(e.timers, t)
	}
	e.idle, e.waking = 0, false
	e.cond.Broadcast()
	e.mu.Unlock()
	if !drained {
		e.mu.Lock()
		unfinished := e.pending
		e.mu.Unlock()
		e.log.Warn("kpar: shutdown timeout passed with records unfinished; cancelling handlers; they will be delivered again",
			"unfinished", unfinished)
		hardStop()
		runErr = errors.Join(runErr, ErrShutdownTimeout)
	}
	// Handlers that ignore their cancelled context keep their workers;
	// Run does not wait for them past the reserve's first half.
	if !waitTimeout(&workers, max(time.Until(deadline.Add(-reserve/2)), time.Millisecond)) && drained {
		runErr = errors.Join(runErr, ErrShutdownTimeout)
	}
	hardStop() // stops the exile writer, which may be retrying a failing sink
	exiles.Wait()

	stopCommitter()
	committer.Wait()
	leaveWithin(ctx, cl, deadline, e.log, "the group waits for the session timeout before moving its partitions", func(cctx context.Context) {
		if err := e.commit(cctx, nil); err != nil {
			e.log.Warn("kpar: final commit failed; records after the last commit will be delivered again", "err", err)
		}
	})
	return runErr
}

// leaveWithin ends a member's session by deadline: last (the final commit,
// or the flush of acknowledgements), then leaving the group, so that Close
// returns at once, then closing cl. unleft says what not leaving costs.
func leaveWithin(ctx context.Context, cl *kgo.Client, deadline time.Time, log *slog.Logger, unleft string, last func(context.Context)) {
	cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	last(cctx)
	if err := cl.LeaveGroupContext(cctx); err != nil {
		log.Warn("kpar: leaving the group timed out; "+unleft, "err", err)
	}
	cancel()
	closeWithin(cl, time.Until(deadline)+time.Second, log)
}

// closeWithin closes cl, waiting for it at most d. The client's Close
// waits for its group loop, which may sit in a JoinGroup that the broker
// holds until a rebalance completes (up to the rebalance timeout, a minute
// by default, when a member of the group does not rejoin): Run must not
// wait that long past its ShutdownTimeout. The client then finishes
// closing in the background.
func closeWithin(cl *kgo.Client, d time.Duration, log *slog.Logger) {
	var closing sync.WaitGroup
	closing.Go(cl.Close)
	if !waitTimeout(&closing, max(d, time.Second)) {
		log.Warn("kpar: the client did not close within the shutdown timeout (a group request still waits on the broker); it finishes closing in the background")
	}
}

// waitTimeout waits for wg up to d and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// drain waits until every admitted record finished, up to d.
func (e *engine) drain(d time.Duration) bool {
	e.mu.Lock()
	e.draining = true
	if e.pending == 0 {
		e.mu.Unlock()
		return true
	}
	e.drained = make(chan struct{})
	ch := e.drained
	e.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
