package kpar

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/progress"
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
// markers) are never waited for. The records of every reader go through the
// same pipeline as a Consumer's, each slice with its own window
// (WindowRecords, from the slice's first unfinished record on) and fetching
// paused while it is full. A backfill is unordered, within a key too.
//
// Every flow rule of a Consumer holds here, with the same options and
// defaults (FlowOpt): Concurrency, AdaptiveConcurrency, RateLimit and
// KeyRateLimit, MaxAttempts, RetryBackoff, AttemptTimeout, Permanent and
// Overloaded (an overloaded downstream burns no attempt, the breaker or the
// adaptive limit paces it), StuckAfter, the DeadLetters sink (a record is
// finished once handled or once the sink acknowledged it; without a sink a
// record that keeps failing is retried until it succeeds), and
// ShutdownTimeout, which bounds the whole shutdown after ctx is cancelled.
// Options that do not apply to a range (Topics, Ordering, RetryTopics,
// InstanceID) do not compile here. Group, if set, names the group in dead
// letters; it joins nothing.
//
// Progress: for each slice, the offset below which every record is
// finished. With ProgressFile it is saved (atomically and fsynced) when it
// moved, at most once per ProgressInterval (default 1s), and when Backfill
// returns. A call with the same file and the same Range resumes: slices are
// read from their saved offsets, finished slices not at all. A file of
// another range is refused (ErrProgressMismatch). After a crash, the
// records a resumed call handles again are those finished above a slice's
// first unfinished record (at most WindowRecords per slice) and those
// finished since the last save. A cancelled ctx loses nothing and repeats
// nothing that finished: the records in flight finish first (up to
// ShutdownTimeout).
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

	hk := newHooks(c.hooks)
	var rs *rangeSource
	e, err := newEngine(c, h, nil, &hk, func(e *engine) source {
		rs = newRangeSource(e, r.Topic, c.progressFile, state)
		return rs
	})
	if err != nil {
		return BackfillResult{}, err
	}
	err = e.run(ctx)
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("kpar: backfill stopped before the range was done: %w", ctx.Err())
	}
	err = errors.Join(err, rs.saveErr)
	e.mu.Lock()
	finished, failed, dead := e.outcomes.Tally()
	res := BackfillResult{
		Records:      finished,
		Failed:       failed,
		DeadLettered: dead,
		AlreadyDone:  rs.alreadyDone,
		Slices:       len(state.Slices),
		Elapsed:      time.Since(start),
	}
	e.mu.Unlock()
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
	case c.progressInterval <= 0:
		return nil, fmt.Errorf("kpar: ProgressInterval(%v) out of range: want more than 0", c.progressInterval)
	case c.readers < 1 || c.readers > maxReaders:
		return nil, fmt.Errorf("kpar: Readers(%d) out of range: want 1 to %d", c.readers, maxReaders)
	}
	// A range has no order to keep: its slices are read at once.
	c.ordering = Unordered
	if err := c.validateFlow(); err != nil {
		return nil, err
	}
	return &c, nil
}

// backfillClientOpts are the options of a reader's client (and, with n 0,
// of the admin client): kpar's fetch defaults, the caller's options, the
// seeds.
func (c *cfg) backfillClientOpts(readers int) []kgo.Opt {
	opts := []kgo.Opt{kgo.WithLogger(kgoLogger(c.logger))}
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
