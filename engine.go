package kpar

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/internal/sched"
	"github.com/kpar/kpar/internal/window"
)

var errNilHandler = errors.New("kpar: nil handler: pass a Handler (or HandlerFunc) to New")

// maxTake bounds how many ready records one worker takes per lock round
// trip. Taking several amortises the lock when handlers are fast; the share
// is ready/Concurrency, so slow handlers still spread one record per worker.
const maxTake = 64

// fastHandler is the per-record handler time below which a worker takes
// several records per lock round trip: there the lock, not the handler,
// dominates, and holding a few records back from other workers costs
// microseconds at most.
const fastHandler = 20 * time.Microsecond

// item is a scheduled record with its bookkeeping.
type item struct {
	rec      *kgo.Record
	part     *partState
	seq      window.Seq
	size     int64
	attempts int
	first    time.Time // first dispatch, for latency

	x *extra // failure and retry-topic state; nil for most records
}

// extra is the state of the few records that failed or came from a retry
// topic, kept out of item so the common record stays small.
type extra struct {
	// Failure history, set under mu by fail.
	firstFailure time.Time
	lastFailure  time.Time
	lastErr      error
	class        deadletter.Class
	warnedNoSink bool

	// Records consumed from a retry topic: the level n of <topic>.retry.<n>,
	// when they are due, the attempts before this level, and the original
	// record the handler sees.
	level         int
	due           time.Time
	priorAttempts int
	origin        *kgo.Record
}

// ext returns it's extra state, allocating it on first use.
func (it *item) ext() *extra {
	if it.x == nil {
		it.x = new(extra)
	}
	return it.x
}

// level is the retry topic level the record came from, 0 for the original
// topic.
func (it *item) level() int {
	if it.x == nil {
		return 0
	}
	return it.x.level
}

// original is the record as the handler sees it: for a record from a retry
// topic, the original topic, partition, offset and headers.
func (it *item) original() *kgo.Record {
	if it.x != nil && it.x.origin != nil {
		return it.x.origin
	}
	return it.rec
}

func (it *item) totalAttempts() int {
	if it.x == nil {
		return it.attempts
	}
	return it.x.priorAttempts + it.attempts
}

type task = sched.Task[item]

type tp struct {
	topic     string
	partition int32
}

type partStatus uint8

const (
	live     partStatus = iota // records are dispatched
	revoking                   // being revoked: finishing in-flight records, dispatching nothing new
	dropped                    // state released; late completions are ignored
)

// partState is one assigned partition. Every field is guarded by engine.mu.
type partState struct {
	tp
	status  partStatus
	level   int // n when this is retry topic n, else 0
	win     *window.Window
	lanes   sched.Lanes[item]
	bytes   int64 // recordSize of unfinished records, held ones included
	waiting int64 // the part of bytes waiting on retry timers, outside engine.bytes
	running int   // records handed to workers and not finished yet
	paused  bool
	// held are fetched records that did not fit in the window, in offset
	// order, waiting for room. Once a window's worth is held the partition
	// is paused until half of that drained, so held records never exceed
	// one window plus one fetch of the partition.
	held      []*kgo.Record
	committed int64         // last committed offset, -1 for none
	idle      chan struct{} // closed when running drops to 0 while revoking

	// Stuck detection, sampled by the watchdog.
	stuckOffset   int64
	stuckSince    time.Time
	stuckReported bool
}

// engine is one Run: the client, the poller, the workers and the committer.
type engine struct {
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

	mu      sync.Mutex
	cond    sync.Cond // workers wait here for ready records or stop
	ready   sched.Queue[item]
	parts   map[tp]*partState
	idle    int   // workers waiting on cond
	bytes   int64 // recordSize of buffered records, but those waiting on retry timers
	pending int   // admitted records not finished, over live partitions
	timers  map[*task]*time.Timer
	stop    bool // workers exit; timers do not fire
	// pollWait is set while the poller waits for buffered bytes to drop
	// below MaxBufferedBytes; space wakes it.
	pollWait bool
	space    chan struct{}
	// exiled records wait for the exile writer (retry topic or dead-letter
	// sink); exileWake nudges it.
	exiled    []*task
	exileWake chan struct{}
	// drained is closed when pending reaches 0 after draining began.
	draining bool
	drained  chan struct{}
}

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

		exileWake:  make(chan struct{}, 1),
		stuckAfter: c.cfg.stuckAfter,
	}
	if e.stuckAfter == 0 {
		e.stuckAfter = 2 * c.cfg.attemptTimeout
	}
	e.cond.L = &e.mu
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
	if c.regex {
		opts = append(opts, kgo.ConsumeRegex())
	}
	return append(opts, owned...)
}

// fatalFetchError logs the errors of a poll and returns the first one that
// retrying cannot fix (see isFatal), for the engine and RunMembers alike.
// who prefixes the error's text and attrs the log lines.
func fatalFetchError(fs kgo.Fetches, log *slog.Logger, who string, attrs ...any) error {
	var fatal error
	fs.EachError(func(topic string, partition int32, err error) {
		switch {
		case errors.Is(err, context.Canceled):
		case isFatal(err):
			if fatal == nil {
				fatal = fmt.Errorf("kpar: %sfatal error from the client (topic %q, partition %d): %w", who, topic, partition, err)
			}
		default:
			log.Warn("kpar: fetch error", append(attrs, "topic", topic, "partition", partition, "err", err)...)
		}
	})
	return fatal
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

	drained := e.drain(e.cfg.shutdownTimeout)
	e.mu.Lock()
	e.stop = true
	for t, tm := range e.timers {
		tm.Stop()
		delete(e.timers, t)
	}
	e.cond.Broadcast()
	e.mu.Unlock()
	if !drained {
		e.log.Warn("kpar: shutdown timeout passed with records unfinished; cancelling handlers")
		hardStop()
	}
	if !waitTimeout(&workers, e.cfg.shutdownTimeout) {
		runErr = errors.Join(runErr, ErrShutdownTimeout)
	}
	hardStop() // stops the exile writer, which may be retrying a failing sink
	exiles.Wait()

	stopCommitter()
	committer.Wait()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.shutdownTimeout)
	if err := e.commit(cctx, nil); err != nil {
		e.log.Warn("kpar: final commit failed; records after the last commit will be delivered again", "err", err)
	}
	cancel()
	cl.Close()
	return runErr
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

// ---- poller ----

// poll is the only caller of PollRecords. It returns nil when ctx ends and
// an error when the client reports a fatal one.
func (e *engine) poll(ctx context.Context) error {
	for {
		if !e.waitForBytes(ctx) {
			return nil
		}
		fs := e.cl.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		if err := fatalFetchError(fs, e.log, ""); err != nil {
			return err
		}
		e.admit(fs)
	}
}

// isFatal reports errors that retrying cannot fix: bad credentials and
// missing permissions. Run returns them instead of looping.
func isFatal(err error) bool {
	return errors.Is(err, kerr.SaslAuthenticationFailed) ||
		errors.Is(err, kerr.TopicAuthorizationFailed) ||
		errors.Is(err, kerr.GroupAuthorizationFailed) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed) ||
		errors.Is(err, kerr.IllegalSaslState) ||
		errors.Is(err, kerr.UnsupportedSaslMechanism)
}

// waitForBytes waits until buffered bytes are below MaxBufferedBytes. It
// reports false when ctx ended first.
func (e *engine) waitForBytes(ctx context.Context) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.bytes >= e.cfg.maxBytes {
		e.pollWait = true
		e.mu.Unlock()
		select {
		case <-e.space:
		case <-ctx.Done():
			e.mu.Lock()
			return false
		}
		e.mu.Lock()
	}
	return true
}

// recordOverhead approximates the memory a buffered record costs beyond its
// bytes: the kgo.Record and kpar's task.
const recordOverhead = 256

// recordSize is what a buffered record counts against MaxBufferedBytes.
func recordSize(r *kgo.Record) int64 {
	n := recordOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// admit puts polled records into their windows and the scheduler. Records
// that do not fit in a full window are held until it has room; once a
// window's worth is held the partition is paused: the client stops fetching
// it while the others go on.
func (e *engine) admit(fs kgo.Fetches) {
	// The lock is taken per partition, and each slab allocated before it,
	// so workers finishing records wait for one partition's worth of
	// bookkeeping at most, not a whole fetch's.
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		slab := make([]task, min(len(p.Records), e.cfg.windowRecords))
		e.mu.Lock()
		defer e.mu.Unlock()
		ps := e.parts[tp{p.Topic, p.Partition}]
		if ps == nil || ps.status != live {
			return // not ours (any more): the owner fetches them again
		}
		recs := p.Records
		// Offsets only grow within an assignment; older ones mean the
		// client rewound (an offset reset). Records already admitted are
		// done or still tracked, so skipping them loses nothing.
		last := ps.win.End() - 1
		if n := len(ps.held); n > 0 {
			last = ps.held[n-1].Offset
		}
		for len(recs) > 0 && recs[0].Offset <= last {
			recs = recs[1:]
		}
		for _, r := range recs {
			size := recordSize(r)
			ps.bytes += size
			e.bytes += size
			e.pending++
		}
		readyBefore := e.ready.Len()
		if len(ps.held) == 0 {
			room := min(len(recs), e.cfg.windowRecords-ps.win.Len())
			e.push(ps, recs[:room], slab)
			recs = recs[room:]
		}
		ps.held = append(ps.held, recs...)
		// Keep up to one window of records fetched ahead, so a draining
		// window refills without waiting for a fetch; pause beyond that.
		// (A resume takes effect only with the next fetch, which can wait
		// FetchMaxWait, so pausing on every overflow stalls the pipeline.)
		if len(ps.held) >= e.cfg.windowRecords && !ps.paused {
			ps.paused = true
			e.cl.PauseFetchPartitions(map[string][]int32{ps.topic: {ps.partition}})
			for _, h := range e.hooks.paused {
				h.OnPartitionPaused(ps.topic, ps.partition, ps.win.Len())
			}
		}
		e.wake(e.ready.Len() - readyBefore)
	})
}

// push appends records to ps's window and schedules them. Called with mu
// held.
func (e *engine) push(ps *partState, recs []*kgo.Record, slab []task) {
	if len(recs) == 0 {
		return
	}
	// One allocation per push instead of one per record; admit brings its
	// own, made outside the lock.
	if len(slab) < len(recs) {
		slab = make([]task, len(recs))
	}
	for i, r := range recs {
		t := &slab[i]
		t.Value = item{rec: r, part: ps, seq: ps.win.Push(r.Offset), size: recordSize(r)}
		if ps.level > 0 {
			decodeRetry(&t.Value, ps.level)
		}
		e.schedule(t)
	}
}

// schedule makes t ready, or parks it behind its key or partition.
func (e *engine) schedule(t *task) {
	ps := t.Value.part
	if ps.level > 0 {
		// Retry topics are unordered: a retried record already left its
		// place in the original order.
		e.ready.Push(t)
		return
	}
	switch e.cfg.ordering {
	case ByPartition:
		if !ps.lanes.Admit(t, 0) {
			return
		}
	case ByKey:
		if k := t.Value.rec.Key; k != nil && !ps.lanes.Admit(t, maphash.Bytes(e.seed, k)) {
			return
		}
	}
	e.ready.Push(t)
}

// wake makes sure an idle worker runs when n records became ready. Called
// with mu held.
//
// It wakes one: a woken worker that leaves ready records behind wakes the
// next (see worker). Waking n at once would make n goroutines fight for mu
// on two cores; the chain ramps up just as fast when handlers are slow.
func (e *engine) wake(n int) {
	if n > 0 && e.idle > 0 {
		e.cond.Signal()
	}
}

// ---- workers ----

func (e *engine) worker(ctx context.Context, slot int) {
	var (
		batch []*task
		recs  []*kgo.Record
		// perRecord estimates this worker's handler time per record. Until
		// a fast handler is measured, records are taken one at a time so a
		// slow handler never sits on records another worker could run.
		perRecord = time.Hour
	)
	e.mu.Lock()
	for {
		for e.ready.Len() == 0 && !e.stop {
			e.idle++
			e.cond.Wait()
			e.idle--
		}
		if e.stop {
			e.mu.Unlock()
			return
		}
		batch = e.take(batch[:0], perRecord)
		if e.ready.Len() > 0 && e.idle > 0 {
			e.cond.Signal() // pass the wake-up on: there is more to do
		}
		e.mu.Unlock()
		if len(batch) == 0 {
			e.mu.Lock()
			continue
		}

		// Both return with mu held, so the last finish and the next take
		// share one lock round trip.
		if e.batch != nil {
			e.runBatch(ctx, slot, batch, &recs)
		} else {
			perRecord = e.runEach(ctx, slot, batch, perRecord)
		}
	}
}

// runEach runs the handler on each taken record and finishes each one as
// soon as its handler returns, so a slow record never holds back the
// completion of a fast one taken with it. It returns the updated estimate of
// the handler's time per record.
func (e *engine) runEach(ctx context.Context, slot int, batch []*task, perRecord time.Duration) time.Duration {
	start := time.Now()
	// A batch only forms when the handler is fast; its records then share
	// one attempt context and one clock reading, which would otherwise cost
	// more than the handler. If the shared context is cancelled (the batch
	// ran past AttemptTimeout), the rest get contexts of their own.
	fast := perRecord < fastHandler
	var shared *attemptCtx
	now := start
	for i := 0; i < len(batch); i++ {
		t := batch[i]
		if shared == nil && i > 0 {
			now = time.Now()
		}
		e.dispatched(t, now)
		actx := shared
		if actx == nil {
			actx = &attemptCtx{Context: ctx, deadline: now.Add(e.cfg.attemptTimeout), task: t, attempt: t.Value.attempts}
			e.slots[slot].Store(actx)
			if fast {
				shared = actx
			}
		}
		err := callHandler(actx, e.handler, t.Value.original())
		timedOut := err != nil && actx.timedOut()
		if actx != shared || actx.Err() != nil {
			e.slots[slot].Store(nil)
			shared = nil
		}
		backoff := e.observe(t, err)
		e.mu.Lock()
		next := e.finish(t, err, timedOut, backoff, now)
		batch[i] = nil
		if next != nil {
			if fast && len(batch) < maxTake && next.Value.part.status == live {
				// Run the key's (or partition's) next record here:
				// no queueing, no wake-up, no hand-off between workers.
				next.Value.part.running++
				batch = append(batch, next)
			} else {
				e.ready.Push(next)
				if i < len(batch)-1 {
					e.wake(1)
				} // else this worker takes again at once
			}
		}
		if i < len(batch)-1 {
			e.mu.Unlock()
		}
	}
	if shared != nil {
		e.slots[slot].Store(nil)
	}
	took := time.Since(start) / time.Duration(len(batch))
	if perRecord > time.Minute {
		return took
	}
	return (perRecord*3 + took) / 4
}

// runBatch runs the batch handler once on every taken record and returns
// with mu held.
func (e *engine) runBatch(ctx context.Context, slot int, batch []*task, recs *[]*kgo.Record) {
	start := time.Now()
	*recs = (*recs)[:0]
	for _, t := range batch {
		e.dispatched(t, start)
		*recs = append(*recs, t.Value.original())
	}
	actx := &attemptCtx{Context: ctx, deadline: start.Add(e.cfg.attemptTimeout), task: batch[0], attempt: batch[0].Value.attempts}
	e.slots[slot].Store(actx)
	err := e.callBatch(actx, *recs)
	e.slots[slot].Store(nil)
	timedOut := err != nil && actx.timedOut()
	backoffs := make([]time.Duration, len(batch))
	for i, t := range batch {
		backoffs[i] = e.observe(t, err)
	}
	now := time.Now()
	e.mu.Lock()
	handedOver := 0
	for i, t := range batch {
		if next := e.finish(t, err, timedOut, backoffs[i], now); next != nil {
			e.ready.Push(next)
			handedOver++
		}
		batch[i] = nil
	}
	e.wake(handedOver - 1) // this worker takes one itself
	clear(*recs)
}

// take pops the records this worker runs next and marks them running.
// Workers whose handler is fast take a share of the ready queue at once, so
// the lock is paid once per several records; others take one. Called with
// mu held.
func (e *engine) take(batch []*task, perRecord time.Duration) []*task {
	n := 1
	if e.batch == nil && perRecord < fastHandler {
		n = min(maxTake, (e.ready.Len()+e.cfg.concurrency-1)/e.cfg.concurrency)
	}
	for len(batch) < n {
		t := e.ready.Pop()
		if t == nil {
			break
		}
		ps := t.Value.part
		if ps.status != live {
			continue // revoked: its new owner handles it
		}
		if ps.level > 0 {
			if wait := time.Until(t.Value.x.due); wait > 0 {
				// Not due yet: wait on a timer, not on a worker. The
				// retry partition's window fills and pauses meanwhile.
				e.retryLater(t, wait)
				continue
			}
		}
		ps.running++
		batch = append(batch, t)
		if e.batch != nil {
			batch = e.fillBatch(batch, t)
		}
	}
	return batch
}

// fillBatch extends a batch started by first with the records that may run
// with it: the parked records of its lane in Key and Partition modes, the
// ready records of its partition that follow it in Unordered mode.
func (e *engine) fillBatch(batch []*task, first *task) []*task {
	ps := first.Value.part
	for len(batch) < e.cfg.batchSize {
		var next *task
		if e.cfg.ordering == Unordered || !isLaned(e.cfg.ordering, first) {
			if h := e.ready.Peek(); h != nil && h.Value.part == ps && !isLaned(e.cfg.ordering, h) {
				next = e.ready.Pop()
			}
		} else {
			next = ps.lanes.TakeNext(first)
		}
		if next == nil {
			break
		}
		ps.running++
		batch = append(batch, next)
	}
	return batch
}

func isLaned(o Order, t *task) bool {
	return t.Value.x == nil && (o == ByPartition || (o == ByKey && t.Value.rec.Key != nil))
}

func (e *engine) dispatched(t *task, now time.Time) {
	it := &t.Value
	it.attempts++
	if it.attempts == 1 {
		it.first = now
	}
	for _, h := range e.hooks.dispatched {
		h.OnRecordDispatched(it.original(), it.attempts)
	}
}

// callHandler runs h on r, turning a panic into a *PanicError: a panic is
// a failed attempt, not a crash. It serves the engine and RunMembers alike.
func callHandler(ctx context.Context, h Handler, r *kgo.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h.Handle(ctx, r)
}

func (e *engine) callBatch(ctx context.Context, rs []*kgo.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return e.batch.HandleBatch(ctx, rs)
}

// observe runs the hooks and logs for a finished attempt, outside the lock,
// and returns the backoff before the next attempt when it failed.
func (e *engine) observe(t *task, err error) time.Duration {
	it := &t.Value
	if err == nil {
		if len(e.hooks.done) > 0 {
			lat := time.Since(it.first)
			for _, h := range e.hooks.done {
				h.OnRecordDone(it.original(), it.totalAttempts(), lat)
			}
		}
		return 0
	}
	backoff := e.cfg.backoff(it.attempts)
	if d, ok := retryAfter(err); ok {
		backoff = max(d, time.Millisecond)
	}
	r := it.original()
	attrs := []any{"topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
		"attempt", it.attempts, "retry_in", backoff, "err", err}
	if pe, ok := err.(*PanicError); ok {
		attrs = append(attrs, "stack", string(pe.Stack))
	}
	e.log.Warn("kpar: handler failed", attrs...)
	for _, h := range e.hooks.failed {
		h.OnAttemptFailed(r, it.totalAttempts(), err, backoff)
	}
	return backoff
}

// backoff is full jitter over an exponential capped at retryMax.
// It serves the engine and RunMembers alike.
func (c *cfg) backoff(attempt int) time.Duration {
	d := c.retryMax
	if attempt < 32 {
		d = min(c.retryBase<<(attempt-1), c.retryMax)
	}
	return time.Duration(rand.Int64N(int64(d)) + 1)
}

// finish records the outcome of one attempt and returns the record's lane
// successor, if it completed one (see complete). Called with mu held.
func (e *engine) finish(t *task, err error, timedOut bool, backoff time.Duration, now time.Time) (next *task) {
	ps := t.Value.part
	ps.running--
	switch {
	case ps.status == dropped:
	case err == nil:
		next = e.complete(t)
	case ps.status == revoking:
		// Not retried here: the record stays unfinished, so the revoke
		// commit stops below it and the next owner handles it.
	default:
		e.fail(t, err, timedOut, backoff, now)
	}
	if ps.running == 0 && ps.idle != nil {
		close(ps.idle)
		ps.idle = nil
	}
	return next
}

// complete marks a record done: its window may move, its bytes are
// released, and its lane's next record, if any, is returned: the caller
// runs it or makes it ready. Called with mu held.
func (e *engine) complete(t *task) (next *task) {
	ps := t.Value.part
	ps.win.Done(t.Value.seq)
	next = ps.lanes.Release(t)
	e.release(ps, t)
	if len(ps.held) > 0 {
		// Refill in chunks of a quarter window so slabs stay large.
		if room := e.cfg.windowRecords - ps.win.Len(); room >= max(1, e.cfg.windowRecords/4) || room >= len(ps.held) {
			n := min(room, len(ps.held))
			readyBefore := e.ready.Len()
			e.push(ps, ps.held[:n], nil)
			clear(ps.held[:n])
			ps.held = ps.held[n:]
			if len(ps.held) == 0 {
				ps.held = nil
			}
			e.wake(e.ready.Len() - readyBefore)
		}
	}
	if ps.paused && len(ps.held) <= e.cfg.windowRecords/2 {
		ps.paused = false
		e.cl.ResumeFetchPartitions(map[string][]int32{ps.topic: {ps.partition}})
		for _, h := range e.hooks.resumed {
			h.OnPartitionResumed(ps.topic, ps.partition, ps.win.Len())
		}
	}
	return next
}

// release returns a finished record's budget. Called with mu held.
func (e *engine) release(ps *partState, t *task) {
	ps.bytes -= t.Value.size
	e.bytes -= t.Value.size
	e.pending--
	t.Value.rec = nil // the slab may outlive the record; let the record go
	e.budgetFreed()
}

// budgetFreed wakes the poller or the drain when they wait for it. Called
// with mu held.
func (e *engine) budgetFreed() {
	if e.pollWait && e.bytes < e.cfg.maxBytes {
		e.pollWait = false
		select {
		case e.space <- struct{}{}:
		default:
		}
	}
	if e.draining && e.pending == 0 && e.drained != nil {
		close(e.drained)
		e.drained = nil
	}
}

// retryLater re-queues a failed record after backoff. The record keeps its
// lane meanwhile, so later records of its key (or partition) wait for it;
// other lanes go on. Called with mu held.
func (e *engine) retryLater(t *task, backoff time.Duration) {
	// A record waiting on a timer leaves the shared byte budget: however
	// many records wait for retries, healthy partitions keep being fetched.
	// Each partition's window still bounds its waiting records.
	ps, size := t.Value.part, t.Value.size
	ps.waiting += size
	e.bytes -= size
	e.budgetFreed()
	e.timers[t] = time.AfterFunc(backoff, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if _, ok := e.timers[t]; !ok || e.stop {
			return
		}
		delete(e.timers, t)
		if ps.status != live {
			return
		}
		ps.waiting -= size
		e.bytes += size
		e.ready.Push(t)
		e.wake(1)
	})
}

// ---- rebalances ----

func (e *engine) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	e.mu.Lock()
	for topic, ps := range assigned {
		for _, p := range ps {
			k := tp{topic, p}
			if old := e.parts[k]; old != nil {
				e.dropLocked(old)
			}
			e.parts[k] = &partState{
				tp:        k,
				level:     e.retryLevelOf(topic),
				win:       window.New(e.cfg.windowRecords),
				committed: -1,
			}
		}
	}
	e.mu.Unlock()
	e.log.Info("kpar: partitions assigned", "assigned", assigned)
	for _, h := range e.hooks.assigned {
		h.OnPartitionsAssigned(assigned)
	}
}

// onRevoked stops dispatching the revoked partitions, waits up to
// RevokeTimeout for their running records, commits their window starts and
// drops their state.
func (e *engine) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	var (
		revokingParts []*partState
		idle          []chan struct{}
	)
	e.mu.Lock()
	for topic, ps := range revoked {
		for _, p := range ps {
			s := e.parts[tp{topic, p}]
			if s == nil || s.status != live {
				continue
			}
			s.status = revoking
			revokingParts = append(revokingParts, s)
			if s.running > 0 {
				s.idle = make(chan struct{})
				idle = append(idle, s.idle)
			}
		}
	}
	e.mu.Unlock()

	t := time.NewTimer(e.cfg.revokeTimeout)
	defer t.Stop()
wait:
	for _, ch := range idle {
		select {
		case <-ch:
		case <-t.C:
			e.log.Warn("kpar: revoke timeout passed with records running; committing what finished")
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	if len(revokingParts) == 0 {
		return
	}
	if err := e.commit(ctx, revokingParts); err != nil {
		e.log.Warn("kpar: commit on revoke failed; the new owner may handle some records again", "err", err)
	}
	e.mu.Lock()
	for _, s := range revokingParts {
		e.dropLocked(s)
	}
	e.mu.Unlock()
	e.log.Info("kpar: partitions revoked", "revoked", revoked)
	for _, h := range e.hooks.revoked {
		h.OnPartitionsRevoked(revoked, false)
	}
}

// onLost drops lost partitions without committing: another member may own
// them already.
func (e *engine) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	e.mu.Lock()
	for topic, ps := range lost {
		for _, p := range ps {
			if s := e.parts[tp{topic, p}]; s != nil {
				e.dropLocked(s)
			}
		}
	}
	e.mu.Unlock()
	e.log.Warn("kpar: partitions lost", "lost", lost)
	for _, h := range e.hooks.revoked {
		h.OnPartitionsRevoked(lost, true)
	}
}

// dropLocked releases a partition's state. Its queued records are skipped
// when popped, its retry timers stopped, and late completions ignored.
func (e *engine) dropLocked(ps *partState) {
	if ps.status == dropped {
		return
	}
	ps.status = dropped
	e.bytes -= ps.bytes - ps.waiting
	e.pending -= ps.win.Pending() + len(ps.held)
	ps.bytes, ps.held = 0, nil
	for t, tm := range e.timers {
		if t.Value.part == ps {
			tm.Stop()
			delete(e.timers, t)
		}
	}
	if ps.paused {
		ps.paused = false
		e.cl.ResumeFetchPartitions(map[string][]int32{ps.topic: {ps.partition}})
	}
	if e.parts[ps.tp] == ps {
		delete(e.parts, ps.tp)
	}
	e.budgetFreed()
}

// ---- committer ----

func (e *engine) committer(ctx context.Context) {
	t := time.NewTicker(e.cfg.commitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := e.commit(ctx, nil); err != nil && ctx.Err() == nil {
				e.log.Warn("kpar: commit failed; retrying at the next interval", "err", err)
			}
		}
	}
}

// commit commits the window start of the given partitions (all live and
// revoking ones when only is nil) where it moved since the last commit.
func (e *engine) commit(ctx context.Context, only []*partState) error {
	type pending struct {
		ps  *partState
		off int64
	}
	var todo []pending
	e.mu.Lock()
	add := func(ps *partState) {
		if ps.status == dropped {
			return
		}
		if off, ok := ps.win.Start(); ok && off > ps.committed {
			todo = append(todo, pending{ps, off})
		}
	}
	if only != nil {
		for _, ps := range only {
			add(ps)
		}
	} else {
		for _, ps := range e.parts {
			add(ps)
		}
	}
	e.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}

	offsets := make(map[string]map[int32]kgo.EpochOffset)
	asked := make(map[string]map[int32]int64)
	for _, p := range todo {
		if offsets[p.ps.topic] == nil {
			offsets[p.ps.topic] = make(map[int32]kgo.EpochOffset)
			asked[p.ps.topic] = make(map[int32]int64)
		}
		offsets[p.ps.topic][p.ps.partition] = kgo.EpochOffset{Epoch: -1, Offset: p.off}
		asked[p.ps.topic][p.ps.partition] = p.off
	}
	var commitErr error
	e.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			commitErr = err
			asked = nil // the request failed: nothing was committed
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
	e.mu.Lock()
	for _, p := range todo {
		if off, ok := asked[p.ps.topic][p.ps.partition]; ok && off > p.ps.committed {
			p.ps.committed = off
		}
	}
	e.mu.Unlock()
	for _, h := range e.hooks.commit {
		h.OnCommit(asked, commitErr)
	}
	return commitErr
}

// stats snapshots every partition for Consumer.Partitions.
func (e *engine) stats() []PartitionStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]PartitionStats, 0, len(e.parts))
	for _, ps := range e.parts {
		start, ok := ps.win.Start()
		if !ok {
			start = -1
		}
		out = append(out, PartitionStats{
			Topic:     ps.topic,
			Partition: ps.partition,
			Start:     start,
			End:       ps.win.End(),
			Committed: ps.committed,
			Buffered:  ps.win.Len(),
			Held:      len(ps.held),
			Finished:  ps.win.FinishedAbove(),
			InFlight:  ps.running,
			Paused:    ps.paused,
		})
	}
	slices.SortFunc(out, func(a, b PartitionStats) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition - b.Partition)
	})
	return out
}
