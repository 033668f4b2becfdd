package kpar

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/awake"
	"github.com/kpar/kpar/internal/buffer"
	"github.com/kpar/kpar/internal/cost"
	"github.com/kpar/kpar/internal/limits"
	"github.com/kpar/kpar/internal/retry"
	"github.com/kpar/kpar/internal/sched"
	"github.com/kpar/kpar/internal/settle"
)

var errNilHandler = errors.New("kpar: nil handler: pass a Handler (or HandlerFunc) to New")

// engine is the pipeline of one Run, or of one Backfill: the rooms every
// source shares (source.go), built whole by newEngine for every source.
//
// Lock map: every lock of the package, what it guards, and what is never
// done under it. No lock is held across a network call or a log call (a
// slog handler is user code too), but groupSource.commitMu, which exists
// to serialise commits across their requests.
//
//   - engine.mu, the pipeline's lock (with cond, the workers' wait on
//     it): parts and the partStates in it, and every field after it. The
//     rooms that are packages of their own (internal/cost, awake, buffer,
//     settle, limits, retry, sched, window, limit, throttle) keep their
//     state unexported, so only their methods, called by the engine under
//     mu, change it; the rooms still embedded here (dispatch, pauses, the
//     outputs waiting for a transaction) say which file works them. Held
//     for bookkeeping only: no handler, hook, client call or log runs
//     under it. Its word and what it guards change with every record, so the
//     fields before it, read by every worker, sit on other cache lines.
//     Taken last: no other lock of the package is taken while holding it.
//   - groupSource.commitMu (group.go): serialises commits from snapshot
//     to response (commit.go, txn.go), so an older commit never lands
//     after a newer one: the settler's, a revoke's, the final one. Held
//     across the OffsetCommit (or the transaction) by design; taken
//     before engine.mu, which the commit takes only to snapshot and to
//     note the response.
//   - topicIDCache.mu (topicids.go, groupSource.ids): the transactional
//     commit's cache of topic IDs, for map operations only; the metadata
//     request that fills a miss runs without it.
//   - shareSource.mu (sharesource.go): the records a share-group member
//     holds and their lock renewals. Never nested with engine.mu.
//   - attemptCtx.mu (attempt.go): one attempt context's cancellation and
//     AfterFuncs, which run after it is released.
//   - overloadLog.mu (overload.go) and misconfigLog.mu
//     (misconfigured.go): the overload and misconfiguration spells'
//     tallies, worked only by their own methods (failed, recovered),
//     which the workers call with the engine's logger; each logs after
//     releasing it.
//   - lostWork.mu (lostwork.go): the finished offsets of lost partitions,
//     and ExactlyOnce's outputs of them, kept for their next assignment;
//     taken after engine.mu is released, nothing taken under it.
//   - inFlight.mu (outputs.go): which output of a record failed first,
//     and its error; the record is finished after it is released.
//   - topicLimits.mu (toolarge.go): the cache of topics'
//     max.message.bytes; never held across the request that fills it.
//   - Consumer.mu (consumer.go), refusal.mu (ordering.go), goneNews.mu
//     (topicwatch.go), RunMembers' errMu (members.go) and commitTxn's
//     produce-error lock (txn.go): a field or two each, set and read.
//
// Owned by one goroutine, no lock: a worker (worker.go), each worker
// goroutine's own state (its slot, the records it took, its estimate of
// the handler's time, its shared attempt context); it reaches the engine's
// state only under mu.
//
// Atomics, read without a lock: slots, overdue, closing.
type engine struct {
	// Set by newEngine; read-only afterwards: no field of engine is
	// written after newEngine returns but those guarded by mu and the
	// atomics.
	cfg        *cfg
	handler    Handler
	batch      BatchHandler
	hooks      *hooks
	log        *slog.Logger
	seed       maphash.Seed
	stuckAfter time.Duration
	src        source
	// retryTo names the retry topics and reads their levels (retrytopics.go).
	retryTo retry.Topics
	// keep, for a source that withdraws records at shutdown (share
	// groups), says which must run all the same. Called with mu held.
	keep func(*kgo.Record) bool
	// producer writes retry-topic records: the group source, through its
	// client; nil for the sources that refuse RetryTopics.
	producer producer
	// out produces what handlers emit (outputs.go); nil unless Outputs or
	// ExactlyOnce. Its client is closed by run.
	out *outputs

	slots   attemptSlots // each worker's running attempt, for the watchdog
	overdue atomic.Int64 // attempts running past their deadline at the last scan
	// closing is set when shutdown begins: revokes from then on (leaving
	// the group) do not wait for running records, the drain did.
	closing atomic.Bool
	over    overloadLog  // summarises overload logs; a lock of its own
	misconf misconfigLog // logs Misconfigured spells; a lock of its own

	_ [falseSharingPad]byte

	mu    sync.Mutex
	parts map[tp]*partState
	dispatch
	cost cost.Model // the handler-cost model (cost.go)
	// awake is the workers asleep, the wake-up on its way, the awake cap
	// and the stuck guard's count (awake.go, schedule.go's wake).
	awake awake.Cap
	// guard is the stuck guard's timer, armed while the cap holds a
	// wake-up back or a wide lane's running record is watched (awake.go).
	guard *time.Timer
	// buf is the byte budget, the records a drain waits for, and (with
	// each partState's part) the reasons to pause fetching
	// (internal/buffer, worked by admit.go).
	buf buffer.Total
	// overParts are the partitions whose fetched records wait, beyond
	// MaxBufferedBytes, to be admitted (partState.over), in the order
	// they are served (admitOver).
	overParts []*partState
	// space is closed, and set to nil, when buffered bytes drop below
	// MaxBufferedBytes while pollers wait for it; nil while none waits.
	space chan struct{}
	// drained is closed when the last admitted record finishes after
	// draining began; nil while none waits.
	drained chan struct{}
	// limits decide whether an attempt may start now: the attempts
	// running, the adaptive limit or the breaker, the rate limits
	// (internal/limits, worked by worker.go's limited and limitDone and
	// throttle.go's keyWait); limitWake is armed while a limit pauses
	// dispatching.
	limits    limits.Gate
	limitWake *time.Timer
	// retries is where failed records wait (internal/retry, worked by
	// failures.go): on a backoff timer, or for the exile writer (retry
	// topic or dead-letter sink), which exileWake nudges.
	retries   retry.Room[*task, *time.Timer]
	exileWake chan struct{}
	pauses
	settling
	hangs hangWatch // successes and outages, for the hang policy (hang.go)
}

// dispatch is the ready queue and the workers that take from it
// (worker.go, schedule.go). Guarded by engine.mu.
type dispatch struct {
	cond  sync.Cond // workers wait here for ready records or stop
	ready sched.Queue[item]
	// The workers waiting on cond, and the wake-up on its way, are
	// e.awake's (internal/awake).
	//
	// running holds the record each worker runs now, for stuck reports
	// (cheap records share one attempt context, so a worker's attempt
	// slot does not say which record runs), and the stuck guard's tick
	// when it took it (awake.go). A worker sets its own in the lock round
	// trip that takes the record: no atomic per record.
	running []slotRecord
	stop    bool // workers exit; timers do not fire
	// taskPool is the free task chunks of the windows' taskStores.
	taskPool taskPool
	// runsEntered counts the record runs entered (run.go), for tests.
	runsEntered uint64
}

// pauses are pause and resume decisions waiting for the fetch controller
// (admit.go), which applies them through the source outside the lock.
// Guarded by engine.mu. Why to pause is internal/buffer's (buffer.Part);
// what is left here is a queue handed to a goroutine and its wake-up,
// too small for a package of its own.
type pauses struct {
	toggles    []fetchToggle
	toggleWake chan struct{} // capacity 1
}

// settling is what finished records leave for the source's settle
// (settle.go). Guarded by engine.mu.
type settling struct {
	// outcomes is the request to settle, the acknowledgements and the
	// tallies (internal/settle); commitWake (capacity 1) wakes the
	// settler when a request is new.
	outcomes   settle.Outcomes
	commitWake chan struct{}
	// settleReset (capacity 1) drops the settler's backoff
	// (settleAfresh); a channel, not guarded by mu.
	settleReset chan struct{}
	// pendingOutputs are the outputs of finished records that wait for the
	// transaction that commits them (ExactlyOnce, txn.go), in the order
	// the records finished.
	pendingOutputs []pendingOutput
}

// falseSharingPad separates what different goroutines write: two cache
// lines, since CPUs fetch lines in adjacent pairs.
const falseSharingPad = 128

// newEngine builds the whole pipeline for one run of the source that
// newSource makes for it (none, for tests of the engine alone): the
// source's kind sets what the engine asks of it (a share group's
// acknowledgements and withdrawals, a consumer group's producer). With
// Outputs or ExactlyOnce it makes the outputs' client, which does not
// connect yet; run closes it.
func newEngine(c *cfg, h Handler, bh BatchHandler, hk *hooks, newSource func(*engine) source) (*engine, error) {
	e := &engine{
		cfg:        c,
		handler:    h,
		batch:      bh,
		hooks:      hk,
		log:        c.logger,
		seed:       maphash.MakeSeed(),
		stuckAfter: c.stuckAfter,
		retryTo:    retry.NewTopics(c.topics, len(c.retryTopics), c.retryMax),
		slots:      make(attemptSlots, c.concurrency),
		parts:      make(map[tp]*partState),
		buf:        buffer.New(c.maxBytes),
		awake:      awake.New(runtime.GOMAXPROCS(0)),
	}
	if e.stuckAfter == 0 {
		e.stuckAfter = 2 * c.attemptTimeout
	}
	e.cond.L = &e.mu
	e.running = make([]slotRecord, c.concurrency)
	e.retries = retry.New[*task, *time.Timer]()
	e.exileWake = make(chan struct{}, 1)
	e.toggleWake = make(chan struct{}, 1)
	e.settleReset = make(chan struct{}, 1)
	e.commitWake = make(chan struct{}, 1)
	e.limits = newLimits(c)
	e.cost = newHandlerCost(c, bh != nil, e.limits.Rated())
	if newSource != nil {
		e.src = newSource(e)
	}
	if a, ok := e.src.(acknowledger); ok {
		e.outcomes.AckEach()
		e.keep = a.keepAtShutdown
	}
	if p, ok := e.src.(producer); ok {
		e.producer = p
	}
	if c.outputs || c.exactlyOnce {
		out, err := newOutputs(c)
		if err != nil {
			return nil, err
		}
		e.out = out
	}
	return e, nil
}

// run runs the pipeline over e.src until ctx ends, the source is done, or
// a fatal error.
func (e *engine) run(ctx context.Context) error {
	if e.out != nil {
		defer e.out.close()
		if e.cfg.exactlyOnce {
			if err := e.initTransactions(ctx); err != nil { // txninit.go
				return err
			}
		}
	}
	if err := e.src.open(ctx); err != nil {
		return err
	}

	// Handlers keep running while Run drains; this context is cancelled
	// only when the drain times out, or after Run is done.
	hctx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()

	var workers sync.WaitGroup
	for i := range e.cfg.concurrency {
		w := newWorker(e, i)
		workers.Go(func() { w.run(hctx) })
	}
	var exiles sync.WaitGroup
	if e.cfg.deadLetters != nil || len(e.cfg.retryTopics) > 0 {
		exiles.Go(func() { e.exileWriter(hctx) })
	}
	settleCtx, stopSettler := context.WithCancel(context.WithoutCancel(ctx))
	var settler sync.WaitGroup
	settler.Go(func() { e.settler(settleCtx) })
	settler.Go(func() { e.fetchController(settleCtx) })
	settler.Go(func() { e.watchdog(settleCtx, hctx.Done()) })

	deliverCtx, stopDeliver := context.WithCancel(ctx)
	delivered := make(chan error, 1)
	go func() { delivered <- e.src.deliver(deliverCtx) }()

	var runErr error
	select {
	case <-ctx.Done():
		stopDeliver()
		runErr = <-delivered
	case runErr = <-delivered:
		stopDeliver()
	}
	e.log.Info("kpar: stopping: draining buffered records", "timeout", e.cfg.shutdownTimeout)

	// The whole shutdown fits in ShutdownTimeout: the drain gets it but a
	// reserve, and the reserve covers the workers' exit, the final settle
	// and leaving the group.
	deadline := time.Now().Add(e.cfg.shutdownTimeout)
	reserve := min(e.cfg.shutdownTimeout/5, 2*time.Second)
	e.closing.Store(true)
	e.src.stopping()
	drained := e.drain(time.Until(deadline.Add(-reserve)))
	e.mu.Lock()
	e.stop = true
	e.stopGuard()
	e.over.stopQuiet()
	if e.limitWake != nil {
		e.limitWake.Stop()
		e.limitWake = nil
	}
	e.retries.Forget(nil, stopRetry)
	e.awake.WakeAll()
	e.cond.Broadcast()
	unfinished := e.buf.Pending()
	e.mu.Unlock()
	if !drained {
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

	stopSettler()
	settler.Wait()
	if err := e.src.close(ctx, deadline); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("%w: %w", ErrFinalCommit, err))
	}
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

// whenIdle returns a channel closed once every admitted record finished.
func (e *engine) whenIdle() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.buf.Drain() {
		return closedDone
	}
	if e.drained == nil {
		e.drained = make(chan struct{})
	}
	return e.drained
}

// drain waits until every admitted record finished, up to d.
func (e *engine) drain(d time.Duration) bool {
	ch := e.whenIdle()
	select {
	case <-ch:
		return true
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
