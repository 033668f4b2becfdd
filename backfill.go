package kpar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/progress"
	"github.com/kpar/kpar/internal/window"
)

// ErrBadRange is wrapped by the errors Backfill returns for a range that
// cannot be read: From not below To, an offset below the log start or
// above the high watermark, an unknown topic or partition, a time that
// resolves to no offset.
var ErrBadRange = errors.New("kpar: bad range")

// ErrProgressMismatch is wrapped by the error Backfill returns when the
// ProgressFile holds the progress of another range (another topic,
// partitions, From or To): reusing it could skip records never handled.
var ErrProgressMismatch = progress.ErrMismatch

// Position is one end of a Range: an offset, or a time that stands for the
// first offset whose record timestamp is at or after it (Kafka's
// ListOffsets by timestamp). The zero Position is offset 0.
type Position struct {
	offset int64
	at     time.Time
	isTime bool
}

// AtOffset is the position of offset o in every partition of the range.
func AtOffset(o int64) Position { return Position{offset: o} }

// AtTime is, in each partition, the first offset whose record timestamp is
// at or after t.
func AtTime(t time.Time) Position { return Position{at: t, isTime: true} }

// ParsePosition parses a decimal offset ("5000") or an RFC 3339 time
// ("2026-03-01T00:00:00Z").
func ParsePosition(s string) (Position, error) {
	if o, err := strconv.ParseInt(s, 10, 64); err == nil {
		if o < 0 {
			return Position{}, fmt.Errorf("kpar: position %q: offsets are 0 or more", s)
		}
		return AtOffset(o), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return Position{}, fmt.Errorf("kpar: position %q is neither an offset nor an RFC 3339 time (2006-01-02T15:04:05Z)", s)
	}
	return AtTime(t), nil
}

// String is the offset in decimal, or the time in RFC 3339 (UTC); it parses
// back with ParsePosition.
func (p Position) String() string {
	if p.isTime {
		return p.at.UTC().Format(time.RFC3339Nano)
	}
	return strconv.FormatInt(p.offset, 10)
}

// Range is a fixed range of records of one topic: From inclusive, To
// exclusive, in each of Partitions (every partition when empty).
type Range struct {
	Topic      string
	Partitions []int32
	From, To   Position
}

// BackfillResult says what one Backfill call did.
type BackfillResult struct {
	// Records counts the records this call finished: handled successfully
	// or acknowledged by the dead-letter sink.
	Records int64
	// Failed counts the finished records whose handler failed at least
	// once (retried successfully, or dead-lettered).
	Failed int64
	// DeadLettered counts the records the dead-letter sink acknowledged.
	DeadLettered int64
	// AlreadyDone counts the offsets the ProgressFile recorded as finished
	// by an earlier run, which this call did not read again.
	AlreadyDone int64
	// Slices is how many slices the range was cut into (Readers per
	// partition, fewer for partitions with fewer offsets).
	Slices  int
	Elapsed time.Duration
}

// Readers sets how many readers Backfill runs per partition, each with its
// own client reading its own slice of the range, overriding the default 1.
// Readers add fetch parallelism; Concurrency bounds the handlers across all
// of them.
func Readers(n int) BackfillOpt { return backfillOpt(func(c *cfg) { c.readers = n }) }

// ProgressFile makes Backfill keep its progress in the file at path, and
// resume from it: see Backfill. Default: none (progress lives in memory and
// a new call starts over).
func ProgressFile(path string) BackfillOpt {
	return backfillOpt(func(c *cfg) { c.progressFile = path })
}

// ProgressInterval sets the least time between two saves of the
// ProgressFile, overriding the default 1s: a save is an fsynced file
// write, and a crash repeats what finished since the last one.
func ProgressInterval(d time.Duration) BackfillOpt {
	return backfillOpt(func(c *cfg) { c.progressInterval = d })
}

// maxReaders bounds Readers: each reader is a client with its connections.
const maxReaders = 256

// Backfill hands every record of a fixed range to h and returns when the
// range is done, when ctx is cancelled (after draining, as Run does), or on
// an error that retrying cannot fix.
//
// No consumer group is involved. Each partition's range is cut into
// Readers slices of equal offset counts; each slice has a reader of its own
// (a client assigned to the partition at the slice's first offset) that
// stops at the slice's end, or at the partition's high watermark, whichever
// comes first: offsets that do not exist (compacted records, transaction
// markers) are never waited for. Records of all readers go to one pool of
// Concurrency workers and are handled in any order: a backfill is unordered,
// within a key too. A slice's reader waits while its window is full:
// WindowRecords records from the slice's first unfinished one on.
//
// Failures follow the engine's rules: MaxAttempts, RetryBackoff,
// AttemptTimeout and Permanent as for a Consumer, then the DeadLetters sink;
// a record is finished once handled or once the sink acknowledged it.
// Without a sink a record that keeps failing is retried until it succeeds.
// RetryTopics and TopicRegex are not supported; Topics, the Ordering and
// batch options do not apply. Group, if set, names the group in dead
// letters; it joins nothing.
//
// Progress: for each slice, the offset below which every record is
// finished. With ProgressFile it is saved (atomically and fsynced) when it
// moved, at most once per CommitInterval (default 1s here), and when Backfill returns. A call
// with the same file and the same Range resumes: slices are read from their
// saved offsets, finished slices not at all. A file of another range is
// refused (ErrProgressMismatch). After a crash, the records a resumed call
// handles again are those finished above a slice's first unfinished record
// (at most WindowRecords per slice) and those finished since the last save.
// A cancelled ctx loses nothing and repeats nothing that finished: the
// records in flight finish first (up to ShutdownTimeout).
//
// Errors wrapping ErrBadRange name what is wrong with r; a cancelled call
// returns an error wrapping ctx.Err() with the result so far.
func Backfill(ctx context.Context, h Handler, r Range, opts ...BackfillOpt) (BackfillResult, error) {
	start := time.Now()
	if h == nil {
		return BackfillResult{}, errors.New("kpar: nil handler: pass a Handler (or HandlerFunc) to Backfill")
	}
	c, err := backfillConfig(r, opts)
	if err != nil {
		return BackfillResult{}, err
	}
	admin, err := kgo.NewClient(c.backfillClientOpts(0)...)
	if err != nil {
		return BackfillResult{}, fmt.Errorf("kpar: creating the client: %w", err)
	}
	defer admin.Close()

	want := rangeSpec(r)
	var state *progress.State
	if c.progressFile != "" {
		if state, err = progress.Load(c.progressFile); err != nil {
			return BackfillResult{}, fmt.Errorf("kpar: %w", err)
		}
		if state != nil {
			if err := state.Check(c.progressFile, want); err != nil {
				return BackfillResult{}, fmt.Errorf("kpar: %w", err)
			}
			c.logger.Info("kpar: backfill resuming from the progress file", "file", c.progressFile,
				"slices", len(state.Slices), "remaining_offsets", state.Remaining())
		}
	}
	if state == nil {
		bounds, err := resolveRange(ctx, kadm.NewClient(admin), r)
		if err != nil {
			return BackfillResult{}, err
		}
		state = &progress.State{Range: want, Slices: cutSlices(bounds, c.readers)}
		if c.progressFile != "" {
			// Saved at once: a crash before the first interval resumes with
			// the same slices, not with a range resolved again.
			if err := progress.Save(c.progressFile, state); err != nil {
				return BackfillResult{}, fmt.Errorf("kpar: %w", err)
			}
		}
	}
	admin.Close()

	b := newBackfill(c, h, r.Topic, c.progressFile, state)
	err = b.run(ctx)
	res := BackfillResult{
		Records:      b.records.Load(),
		Failed:       b.failed.Load(),
		DeadLettered: b.deadLettered.Load(),
		AlreadyDone:  b.alreadyDone,
		Slices:       len(b.slices),
		Elapsed:      time.Since(start),
	}
	return res, err
}

// backfillConfig applies opts and checks them. It reuses the Consumer's
// validation, standing in the range's topic (and a group name when none was
// given) for the options a Consumer requires and a backfill does not.
func backfillConfig(r Range, opts []BackfillOpt) (*cfg, error) {
	c := defaultCfg()
	c.backfill = true
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	switch {
	case r.Topic == "":
		return nil, fmt.Errorf("%w: no topic: set Range.Topic", ErrBadRange)
	case len(c.topics) > 0 || c.regex:
		return nil, errors.New("kpar: Topics and TopicRegex do not apply to Backfill: name the topic in its Range")
	case len(c.retryTopics) > 0:
		return nil, errors.New("kpar: RetryTopics is not supported by Backfill: failed records go to DeadLetters after MaxAttempts")
	case c.rateLimit.on || c.keyRateLimit.on:
		return nil, errors.New("kpar: RateLimit and KeyRateLimit are not supported by Backfill: bound its pace with Concurrency")
	case c.progressInterval <= 0:
		return nil, fmt.Errorf("kpar: ProgressInterval(%v) out of range: want more than 0", c.progressInterval)
	case c.readers < 1 || c.readers > maxReaders:
		return nil, fmt.Errorf("kpar: Readers(%d) out of range: want 1 to %d", c.readers, maxReaders)
	}
	group := c.group
	c.topics = []string{r.Topic}
	if c.group == "" {
		c.group = "kpar-backfill"
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	c.group = group
	return &c, nil
}

// backfillClientOpts are the options of a reader's client (and, with n 0,
// of the admin client): kpar's fetch defaults, the caller's options, the
// seeds.
func (c *cfg) backfillClientOpts(readers int) []kgo.Opt {
	opts := []kgo.Opt{kgo.WithLogger(kgoLogger{L: c.logger})}
	if readers > 0 {
		// Every reader buffers one fetch: together they stay within a
		// quarter of MaxBufferedBytes, as the engine's client does.
		perReader := min(c.maxBytes/4/int64(readers), 50<<20)
		opts = append(opts, kgo.FetchMaxBytes(int32(max(perReader, 1<<20))), kgo.FetchMaxWait(25*time.Millisecond))
	}
	opts = append(opts, c.clientOpts...)
	if len(c.brokers) > 0 {
		opts = append(opts, kgo.SeedBrokers(c.brokers...))
	}
	return opts
}

// rangeSpec is r as a progress file names it.
func rangeSpec(r Range) progress.Range {
	ps := slices.Clone(r.Partitions)
	slices.Sort(ps)
	return progress.Range{Topic: r.Topic, Partitions: ps, From: r.From.String(), To: r.To.String()}
}

// bound is a partition's resolved range [from, to).
type bound struct {
	partition int32
	from, to  int64
}

// resolveRange checks r against the cluster and resolves it to offsets per
// partition, in partition order. Partitions with nothing in range (a time
// range in which a partition has no records) are left out; a range empty
// everywhere is an error.
func resolveRange(ctx context.Context, adm *kadm.Client, r Range) ([]bound, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: topic %q: %s", ErrBadRange, r.Topic, fmt.Sprintf(format, a...))
	}
	switch {
	case !r.From.isTime && r.From.offset < 0:
		return nil, bad("from offset %d is negative", r.From.offset)
	case !r.To.isTime && r.To.offset < 0:
		return nil, bad("to offset %d is negative", r.To.offset)
	case !r.From.isTime && !r.To.isTime && r.From.offset >= r.To.offset:
		return nil, bad("from offset %d is not below to offset %d (from is inclusive, to exclusive)", r.From.offset, r.To.offset)
	case r.From.isTime && r.To.isTime && !r.From.at.Before(r.To.at):
		return nil, bad("from time %s is not before to time %s", r.From, r.To)
	}

	tds, err := adm.ListTopics(ctx, r.Topic)
	if err != nil {
		return nil, fmt.Errorf("kpar: reading the metadata of topic %q: %w", r.Topic, err)
	}
	td, ok := tds[r.Topic]
	if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
		return nil, bad("unknown topic")
	}
	if td.Err != nil {
		return nil, fmt.Errorf("kpar: reading the metadata of topic %q: %w", r.Topic, td.Err)
	}
	parts := slices.Clone(r.Partitions)
	if len(parts) == 0 {
		parts = td.Partitions.Numbers()
	}
	slices.Sort(parts)
	for i, p := range parts {
		if _, ok := td.Partitions[p]; !ok {
			return nil, bad("unknown partition %d (the topic has %d: 0 to %d)", p, len(td.Partitions), len(td.Partitions)-1)
		}
		if i > 0 && parts[i-1] == p {
			return nil, bad("partition %d is listed twice", p)
		}
	}

	list := func(what string, fn func() (kadm.ListedOffsets, error)) (map[int32]int64, error) {
		lo, err := fn()
		if err == nil {
			err = lo.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("kpar: listing the %s offsets of topic %q: %w", what, r.Topic, err)
		}
		out := make(map[int32]int64)
		lo.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
		return out, nil
	}
	starts, err := list("start", func() (kadm.ListedOffsets, error) { return adm.ListStartOffsets(ctx, r.Topic) })
	if err != nil {
		return nil, err
	}
	ends, err := list("end", func() (kadm.ListedOffsets, error) { return adm.ListEndOffsets(ctx, r.Topic) })
	if err != nil {
		return nil, err
	}
	resolve := func(pos Position) (map[int32]int64, error) {
		if !pos.isTime {
			return nil, nil
		}
		return list("by-time", func() (kadm.ListedOffsets, error) {
			return adm.ListOffsetsAfterMilli(ctx, pos.at.UnixMilli(), r.Topic)
		})
	}
	fromAt, err := resolve(r.From)
	if err != nil {
		return nil, err
	}
	toAt, err := resolve(r.To)
	if err != nil {
		return nil, err
	}

	var out []bound
	for _, p := range parts {
		start, end := starts[p], ends[p]
		from, to := r.From.offset, r.To.offset
		if r.From.isTime {
			from = fromAt[p]
		}
		if r.To.isTime {
			to = toAt[p]
		}
		switch {
		case !r.From.isTime && from < start:
			return nil, bad("partition %d: from offset %d is below the log start %d (older records were deleted)", p, from, start)
		case !r.From.isTime && from > end:
			return nil, bad("partition %d: from offset %d is above the high watermark %d", p, from, end)
		case !r.To.isTime && to > end:
			return nil, bad("partition %d: to offset %d is above the high watermark %d (to is exclusive: at most %d)", p, to, end, end)
		case from > to:
			return nil, bad("partition %d: from %s (offset %d) is not below to %s (offset %d)", p, r.From, from, r.To, to)
		case from == to:
			continue // nothing of this partition is in the range
		}
		out = append(out, bound{p, from, to})
	}
	if len(out) == 0 {
		if r.From.isTime {
			return nil, bad("from time %s resolves to no offset: no record in partitions %v has a timestamp at or after it before to %s", r.From, parts, r.To)
		}
		return nil, bad("the range holds no records in partitions %v", parts)
	}
	return out, nil
}

// cutSlices cuts each partition's range into up to readers slices of equal
// offset counts (no empty slice).
func cutSlices(bounds []bound, readers int) []progress.Slice {
	var out []progress.Slice
	for _, b := range bounds {
		size := b.to - b.from
		n := int64(min(int64(readers), size))
		q, rem := size/n, size%n
		lo := b.from
		for i := range n {
			hi := lo + q
			if i < rem {
				hi++
			}
			out = append(out, progress.Slice{Partition: b.partition, From: lo, To: hi, Done: lo})
			lo = hi
		}
	}
	return out
}

// ---- the run ----

// bfSlice is one reader's slice. Its mutable fields are guarded by
// backfill.mu.
type bfSlice struct {
	progress.Slice // Done is the progress as of the start; see doneLocked

	win      *window.Window // records pushed by the reader, finished or not
	roomWake chan struct{}  // nudges the reader when the window's start moved
	readDone bool           // the reader reached the slice's end
	complete bool           // readDone and every pushed record finished
}

// doneLocked is the slice's progress now: every record below it is
// finished. Called with mu held.
func (s *bfSlice) doneLocked() int64 {
	if s.complete {
		return s.To
	}
	if off, ok := s.win.Start(); ok {
		return off
	}
	return s.Done
}

// bfRecord is one record of a slice. t carries the record and its failure
// history in the engine's shape, so the engine's helpers serve it.
type bfRecord struct {
	t  task
	sl *bfSlice
}

// backfill is one Backfill run: readers, workers, the dead-letter writer
// and the progress saver.
type backfill struct {
	cfg   *cfg
	h     Handler
	hooks hooks
	log   *slog.Logger
	topic string
	file  string // progress file; "" for none
	state *progress.State
	// eng is a bare engine (cfg, hooks, log only) for the per-record
	// helpers Backfill shares with the Consumer: dispatched, observe,
	// letter, writeDeadLetters and sinkBackoff.
	eng *engine

	slices      []*bfSlice
	alreadyDone int64

	records, failed, deadLettered atomic.Int64

	mu        sync.Mutex
	cond      sync.Cond   // workers wait here for ready records or stop
	ready     []*bfRecord // FIFO
	timers    map[*bfRecord]*time.Timer
	dead      []*bfRecord // waiting for the dead-letter writer
	deadWake  chan struct{}
	pending   int  // records pushed and not finished
	remaining int  // slices not complete
	moved     bool // progress moved since the last save
	stop      bool // workers exit; timers do not fire
	allDone   chan struct{}
	drained   chan struct{} // closed when pending drops to 0 while draining
}

func newBackfill(c *cfg, h Handler, topic, file string, state *progress.State) *backfill {
	b := &backfill{
		cfg:      c,
		h:        h,
		hooks:    newHooks(c.hooks),
		log:      c.logger,
		topic:    topic,
		file:     file,
		state:    state,
		timers:   make(map[*bfRecord]*time.Timer),
		deadWake: make(chan struct{}, 1),
		allDone:  make(chan struct{}),
	}
	b.eng = &engine{cfg: c, hooks: &b.hooks, log: c.logger}
	b.cond.L = &b.mu
	for _, s := range state.Slices {
		b.alreadyDone += s.Done - s.From
		sl := &bfSlice{Slice: s, win: window.New(c.windowRecords), roomWake: make(chan struct{}, 1)}
		if s.Done >= s.To {
			sl.readDone, sl.complete = true, true
		} else {
			b.remaining++
		}
		b.slices = append(b.slices, sl)
	}
	if b.remaining == 0 {
		close(b.allDone)
	}
	return b
}

func (b *backfill) run(ctx context.Context) error {
	// Handlers keep running while the run drains; hctx ends only when the
	// drain times out, or once the run is over.
	hctx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()
	var toRead []*bfSlice // read before any goroutine starts: no lock yet
	for _, sl := range b.slices {
		if !sl.readDone {
			toRead = append(toRead, sl)
		}
	}
	b.log.Info("kpar: backfill starting", "topic", b.topic, "slices", len(b.slices),
		"to_read", len(toRead), "already_done_offsets", b.alreadyDone, "concurrency", b.cfg.concurrency)

	var workers, deadWriter, saver sync.WaitGroup
	for range b.cfg.concurrency {
		workers.Go(func() { b.worker(hctx) })
	}
	if b.cfg.deadLetters != nil {
		deadWriter.Go(func() { b.deadLetterWriter(hctx) })
	}
	saveCtx, stopSaver := context.WithCancel(context.WithoutCancel(ctx))
	if b.file != "" {
		saver.Go(func() { b.saver(saveCtx) })
	}

	readCtx, stopReaders := context.WithCancel(ctx)
	var readers sync.WaitGroup
	readErr := make(chan error, len(b.slices))
	for _, sl := range toRead {
		readers.Go(func() {
			if err := b.read(readCtx, sl); err != nil {
				readErr <- err
			}
		})
	}

	var runErr error
	select {
	case <-b.allDone:
	case runErr = <-readErr:
	case <-ctx.Done():
		runErr = fmt.Errorf("kpar: backfill stopped before the range was done: %w", ctx.Err())
	}
	stopReaders()
	readers.Wait()

	// Drain: the records handed to workers finish (or reach the sink)
	// within ShutdownTimeout, so a cancel repeats none that finished.
	b.mu.Lock()
	drained := make(chan struct{})
	if b.pending == 0 {
		close(drained)
	} else {
		b.drained = drained
	}
	b.mu.Unlock()
	drainTimer := time.NewTimer(b.cfg.shutdownTimeout)
	select {
	case <-drained:
	case <-drainTimer.C:
		b.log.Warn("kpar: shutdown timeout passed with records unfinished; cancelling handlers")
		hardStop()
	}
	drainTimer.Stop()
	b.mu.Lock()
	b.stop = true // workers exit, timers do not fire
	stopTimers(b.timers)
	b.cond.Broadcast()
	b.mu.Unlock()
	if !waitTimeout(&workers, b.cfg.shutdownTimeout) {
		runErr = errors.Join(runErr, ErrShutdownTimeout)
	}
	hardStop()
	deadWriter.Wait()
	stopSaver()
	saver.Wait()
	if b.file != "" {
		if err := b.save(); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	return runErr
}

// read is the reader of one slice: a client assigned to the slice's
// partition at its progress, pushing the slice's records to the workers
// until it reaches the slice's end or the partition's high watermark.
func (b *backfill) read(ctx context.Context, sl *bfSlice) error {
	readers := len(b.slices)
	opts := append(b.cfg.backfillClientOpts(readers),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{b.topic: {sl.Partition: kgo.NewOffset().At(sl.Done)}}),
		// An offset deleted under us must fail loudly, not restart the
		// slice from wherever the log starts now.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		// Transaction markers take offsets too: seeing them tells the
		// reader it passed its end when the last offsets are markers.
		kgo.KeepControlRecords(),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kpar: creating the client of a backfill reader: %w", err)
	}
	defer cl.Close()

	next := sl.Done // the offset after the last one seen
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return nil
		}
		var fatal error
		fs.EachError(func(topic string, p int32, err error) {
			switch {
			case errors.Is(err, context.Canceled):
			case errors.Is(err, kerr.OffsetOutOfRange):
				fatal = fmt.Errorf("kpar: backfill of %s partition %d: offset %d is no longer in the log (deleted by retention?): %w", topic, p, next, err)
			case isFatal(err), errors.Is(err, kerr.UnknownTopicOrPartition):
				fatal = fmt.Errorf("kpar: backfill of %s partition %d: %w", topic, p, err)
			default:
				b.log.Warn("kpar: backfill fetch error", "topic", topic, "partition", p, "err", err)
			}
		})
		if fatal != nil {
			return fatal
		}
		end := false
		var hwm int64 = -1
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			hwm = max(hwm, p.HighWatermark)
			for _, r := range p.Records {
				if end || r.Offset < next {
					continue
				}
				if r.Offset >= sl.To {
					end = true
					continue
				}
				next = r.Offset + 1
				if !r.Attrs.IsControl() {
					if !b.push(ctx, sl, r) {
						return
					}
				}
				end = next >= sl.To
			}
		})
		if ctx.Err() != nil {
			return nil
		}
		if !end && hwm >= 0 && next >= hwm {
			// The partition ends below the slice's end: offsets that do
			// not exist are not waited for.
			b.log.Warn("kpar: backfill slice ends at the high watermark, below its end", "topic", b.topic,
				"partition", sl.Partition, "high_watermark", hwm, "slice_end", sl.To)
			end = true
		}
		if end {
			b.mu.Lock()
			sl.readDone = true
			b.maybeCompleteLocked(sl)
			b.mu.Unlock()
			return nil
		}
	}
}

// push hands r to the workers once its slice's window has room: fewer
// than WindowRecords records from the first unfinished one through the
// last pushed. That bounds what a crash makes the next run repeat, finished
// records above an unfinished one included. It reports false when ctx
// ended first.
func (b *backfill) push(ctx context.Context, sl *bfSlice, r *kgo.Record) bool {
	rec := &bfRecord{sl: sl}
	rec.t.Value.rec = r
	b.mu.Lock()
	for sl.win.Len() >= b.cfg.windowRecords {
		b.mu.Unlock()
		select {
		case <-sl.roomWake:
		case <-ctx.Done():
			return false
		}
		b.mu.Lock()
	}
	rec.t.Value.seq = sl.win.Push(r.Offset)
	b.pending++
	b.ready = append(b.ready, rec)
	b.cond.Signal()
	b.mu.Unlock()
	return true
}

func (b *backfill) worker(ctx context.Context) {
	for {
		b.mu.Lock()
		for len(b.ready) == 0 && !b.stop {
			b.cond.Wait()
		}
		if b.stop {
			b.mu.Unlock()
			return
		}
		rec := b.ready[0]
		b.ready[0] = nil
		b.ready = b.ready[1:]
		b.mu.Unlock()

		t := &rec.t
		now := time.Now()
		b.eng.dispatched(t, now)
		actx, cancel := context.WithTimeout(ctx, b.cfg.attemptTimeout)
		err := callHandler(actx, b.h, t.Value.rec)
		timedOut := err != nil && errors.Is(actx.Err(), context.DeadlineExceeded)
		cancel()
		if err == nil {
			b.eng.observe(t, nil)
			b.finish(rec, false)
			continue
		}
		if ctx.Err() != nil {
			continue // hard stop: the record stays unfinished
		}
		backoff := b.eng.observe(t, err)
		b.failedAttempt(rec, err, timedOut, backoff, time.Now())
	}
}

// failedAttempt retries a record after backoff, or hands it to the
// dead-letter writer once its attempts are used up (at once for Permanent),
// as the engine's fail does. Without a sink the record is retried at the
// backoff cap: it is never skipped.
func (b *backfill) failedAttempt(rec *bfRecord, err error, timedOut bool, backoff time.Duration, now time.Time) {
	it := &rec.t.Value
	noteFailure(it, err, timedOut, now)
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.cfg.nextStep(it, b.log) {
	case stepRetry:
		b.retryLocked(rec, backoff)
	case stepDeadLetter: // stepRetryTopic cannot happen: Backfill rejects RetryTopics
		b.dead = append(b.dead, rec)
		select {
		case b.deadWake <- struct{}{}:
		default:
		}
	default:
		b.retryLocked(rec, b.cfg.retryMax)
	}
}

// retryLocked makes rec ready again after d. Called with mu held.
func (b *backfill) retryLocked(rec *bfRecord, d time.Duration) {
	if b.stop {
		return
	}
	b.timers[rec] = time.AfterFunc(d, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, ok := b.timers[rec]; !ok || b.stop {
			return
		}
		delete(b.timers, rec)
		b.ready = append(b.ready, rec)
		b.cond.Signal()
	})
}

// finish marks rec finished: its slice's progress may move and its reader
// may push another record.
func (b *backfill) finish(rec *bfRecord, deadLettered bool) {
	failed := rec.t.Value.x != nil
	b.mu.Lock()
	sl := rec.sl
	if sl.win.Done(rec.t.Value.seq) {
		b.moved = true
		select {
		case sl.roomWake <- struct{}{}:
		default:
		}
	}
	b.pending--
	b.maybeCompleteLocked(sl)
	if b.drained != nil && b.pending == 0 {
		close(b.drained)
		b.drained = nil
	}
	b.mu.Unlock()
	rec.t.Value.rec = nil
	b.records.Add(1)
	if failed {
		b.failed.Add(1)
	}
	if deadLettered {
		b.deadLettered.Add(1)
	}
}

// maybeCompleteLocked marks sl complete once its reader reached the end and
// every record it pushed finished. Called with mu held.
func (b *backfill) maybeCompleteLocked(sl *bfSlice) {
	if sl.complete || !sl.readDone || sl.win.Pending() > 0 {
		return
	}
	sl.complete, b.moved = true, true
	b.remaining--
	if b.remaining == 0 {
		close(b.allDone)
	}
}

// deadLetterWriter writes failed records to the sink in batches, retrying a
// failed write with backoff; a record is finished once its write was
// acknowledged. It runs until ctx (the hard stop) ends.
func (b *backfill) deadLetterWriter(ctx context.Context) {
	writeQueued(ctx, b.deadWake, &b.mu, &b.dead, func(batch []*bfRecord) bool {
		ts := tasksOf(batch, func(rec *bfRecord) *task { return &rec.t })
		if !b.eng.deadLetterUntilAcked(ctx, ts, "their slice's progress holds until it succeeds") {
			return false
		}
		for _, rec := range batch {
			b.finish(rec, true)
		}
		return true
	})
}

// saver saves the progress when it moved, at most once per CommitInterval.
func (b *backfill) saver(ctx context.Context) {
	t := time.NewTicker(b.cfg.progressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := b.save(); err != nil {
				b.log.Warn("kpar: saving backfill progress failed; retrying at the next interval", "file", b.file, "err", err)
			}
		}
	}
}

// save writes the progress file if the progress moved since the last save.
// Only the saver and, after it stopped, run call it.
func (b *backfill) save() error {
	b.mu.Lock()
	if !b.moved {
		b.mu.Unlock()
		return nil
	}
	b.moved = false
	for i, sl := range b.slices {
		b.state.Slices[i].Done = sl.doneLocked()
	}
	b.mu.Unlock()
	if err := progress.Save(b.file, b.state); err != nil {
		b.mu.Lock()
		b.moved = true
		b.mu.Unlock()
		return fmt.Errorf("kpar: %w", err)
	}
	return nil
}
