package kpar

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Handler handles one record. It returns nil when the record is done; an
// error makes the attempt count as failed and the record is retried with
// backoff (see RetryBackoff). A panic is recovered and counts as a failed
// attempt. ctx carries the attempt's deadline (AttemptTimeout) and is
// cancelled when the deadline passes, with ErrAttemptTimeout as its
// context.Cause (the attempt counts as failed, class timeout), or when
// Run's shutdown timeout passes, with ErrShutdownTimeout as its cause (the
// record is delivered again later). A handler that ignores ctx keeps its
// worker busy until it returns.
type Handler interface {
	Handle(ctx context.Context, r *kgo.Record) error
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, r *kgo.Record) error

// Handle calls f(ctx, r).
func (f HandlerFunc) Handle(ctx context.Context, r *kgo.Record) error { return f(ctx, r) }

// BatchHandler handles up to BatchSize records at once. The records of one
// call belong to one partition and are in offset order; in Key mode they also
// share one key. An error fails every record of the batch: each is retried
// (possibly in other batches).
type BatchHandler interface {
	HandleBatch(ctx context.Context, rs []*kgo.Record) error
}

// BatchHandlerFunc adapts a function to a BatchHandler.
type BatchHandlerFunc func(ctx context.Context, rs []*kgo.Record) error

// HandleBatch calls f(ctx, rs).
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, rs []*kgo.Record) error { return f(ctx, rs) }

// Consumer consumes topics as one member of a consumer group, handling many
// records of each partition at once and committing only offsets below which
// every record is finished; or, with ShareGroup, as a member of a share
// group, acknowledging each record. Create it with New or NewBatch, start
// it with Run, stop it by cancelling Run's context or with Close.
type Consumer struct {
	cfg     cfg
	handler Handler
	batch   BatchHandler
	hooks   hooks

	running atomic.Bool

	mu     sync.Mutex // guards the fields below
	closed bool
	cancel context.CancelFunc // cancels the current Run
	done   chan struct{}      // closed when the current Run returns
	eng    *engine            // the current Run's pipeline, nil between runs
	last   *engine            // the current or last Run's pipeline, for tests
	share  *shareSource       // the current (or last) Run's share source, for ShareStats
}

// New returns a Consumer that hands each record to h. It validates the
// options and starts nothing: Run connects.
func New(h Handler, opts ...ConsumerOpt) (*Consumer, error) {
	return newConsumer(h, nil, opts)
}

// NewBatch returns a Consumer that hands records to h in batches of up to
// BatchSize (default 100) records.
func NewBatch(h BatchHandler, opts ...ConsumerOpt) (*Consumer, error) {
	return newConsumer(nil, h, opts)
}

func newConsumer(h Handler, bh BatchHandler, opts []ConsumerOpt) (*Consumer, error) {
	c := defaultCfg()
	c.batch = bh != nil
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if h == nil && bh == nil {
		return nil, errNilHandler
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if !c.batch {
		c.batchSize = 1
	}
	return &Consumer{cfg: c, handler: h, batch: bh, hooks: newHooks(c.hooks)}, nil
}

// Run joins the group and consumes until ctx is cancelled, Close is called,
// or a fatal error occurs (such as an authentication failure). On the way
// out it stops fetching, drains buffered and in-flight records for up to
// ShutdownTimeout, commits, and leaves the group. It returns nil after a
// clean shutdown, and only after every goroutine it started has exited
// (unless it returns ErrShutdownTimeout).
//
// A Consumer runs once at a time: a concurrent Run returns ErrRunning. After
// Run returns, Run may be called again to rejoin the group. With ShareGroup
// there is nothing to commit: see ShareGroup for what Run acknowledges and
// releases on the way out.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	e, err := newEngine(&c.cfg, c.handler, c.batch, &c.hooks, consumerSource)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if s, ok := e.src.(*shareSource); ok {
		c.share = s
	}
	c.cancel, c.done, c.eng, c.last = cancel, done, e, e
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.eng = nil // the accessors report no run
		c.mu.Unlock()
	}()
	return e.run(ctx)
}

// consumerSource is a Consumer's source: a share group member with
// ShareGroup, else a consumer group member.
func consumerSource(e *engine) source {
	if e.cfg.shareGroup != "" {
		return newShareSource(e)
	}
	return newGroupSource(e)
}

// Close stops a running Run as if its context were cancelled, waits for it
// to return, and makes later calls to Run return ErrClosed. It is safe to
// call more than once and from any goroutine.
func (c *Consumer) Close() {
	c.mu.Lock()
	c.closed = true
	cancel, done := c.cancel, c.done
	c.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Overdue returns how many handler attempts were running past their
// AttemptTimeout at the last check: handlers that ignore their context keep
// their worker busy, and kpar does not start replacements.
func (c *Consumer) Overdue() int {
	c.mu.Lock()
	e := c.eng
	c.mu.Unlock()
	if e == nil {
		return 0
	}
	return int(e.overdue.Load())
}

// ConcurrencyLimit returns how many attempts may run at once now: the
// adaptive limit with AdaptiveConcurrency, else Concurrency. It returns 0
// when not running.
func (c *Consumer) ConcurrencyLimit() int {
	c.mu.Lock()
	e := c.eng
	c.mu.Unlock()
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if lim, on := e.limits.Limit(); on {
		return lim
	}
	return e.cfg.concurrency
}

// PartitionStats is a snapshot of one assigned partition's window.
type PartitionStats struct {
	Topic     string
	Partition int32
	// Start is the lowest unfinished offset: what a commit would store. It
	// is -1 before the first record arrives.
	Start int64
	// End is the offset after the newest fetched record (-1 before any).
	End int64
	// Committed is the last offset kpar committed for the partition in this
	// assignment (-1 for none yet).
	Committed int64
	// Buffered is the window's size: records from Start through End. It
	// never exceeds WindowRecords.
	Buffered int
	// Held counts fetched records waiting for room in a full window. Once
	// two of the partition's fetches are held (at least WindowRecords, at
	// most eight times that) the partition is paused until half of them
	// moved into the window, so Held never exceeds 8 × WindowRecords plus
	// one fetch. It also counts fetched records waiting for
	// MaxBufferedBytes to admit them (the partition is paused meanwhile).
	Held int
	// Finished counts records above Start that are already done.
	Finished int
	// InFlight counts records handed to workers and not finished: those a
	// handler runs now, and those queued behind them in the same worker
	// (a worker with a fast handler takes up to 64 at once, and a worker
	// running a record run holds up to 64 records of it).
	InFlight int
	// Paused reports whether fetching is paused: the window is full, the
	// partition holds more than its share of a used-up MaxBufferedBytes,
	// or its fetched records wait for MaxBufferedBytes to admit them.
	Paused bool
	// CommittedFinished counts the offsets above Committed that the last
	// commit's metadata marks finished (offsets compacted away between
	// finished records included): after a crash the next owner skips them.
	CommittedFinished int
	// MetadataCut reports that the finished set did not fit in
	// CommitMetadataBytes at the last commit: the finished records left
	// out would be handled again after a crash.
	MetadataCut bool
	// Skipped counts the records of this assignment finished without
	// running because the last owner's commit metadata listed them.
	Skipped int
}

// Partitions returns a snapshot of every assigned partition's window, for
// progress displays and status pages. It returns nil when not running, and
// with ShareGroup (see ShareStats).
func (c *Consumer) Partitions() []PartitionStats {
	c.mu.Lock()
	e := c.eng
	c.mu.Unlock()
	if e == nil || c.cfg.shareGroup != "" {
		return nil
	}
	return e.stats()
}
