package kpar

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// poll is the only caller of PollRecords. It returns nil when ctx ends and
// an error when the client reports a fatal one.
func (e *engine) poll(ctx context.Context) error {
	fetchLog := fetchErrorLog{log: e.log}
	topics := topicWatch{cl: e.cl, log: e.log, regex: e.cfg.regex, hooks: e.hooks.topicUnavailable, forget: e.forgetTopic}
	for {
		if !e.waitForBytes(ctx) {
			return nil
		}
		fs := e.cl.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		if err := fatalFetchError(fs, &fetchLog, ""); err != nil {
			return err
		}
		topics.observe(fs, time.Now())
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
		errors.Is(err, kerr.UnsupportedSaslMechanism) ||
		errors.Is(err, kerr.InconsistentGroupProtocol)
}

// waitForBytes waits until buffered bytes are below MaxBufferedBytes, or
// until the partitions holding more than their share of them are paused
// and others can still be fetched. It reports false when ctx ended first.
func (e *engine) waitForBytes(ctx context.Context) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.bytes >= e.cfg.maxBytes {
		if e.pauseOverBudget() {
			return true
		}
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
// that do not fit in a full window are held until it has room; once
// heldCap are held the partition is paused: the client stops fetching it
// while the others go on.
func (e *engine) admit(fs kgo.Fetches) {
	// The lock is taken per partition, and each slab allocated before it,
	// so workers finishing records wait for one partition's worth of
	// bookkeeping at most, not a whole fetch's.
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		recs, meta := p.Records, e.prepare(p.Records)
		e.mu.Lock()
		defer e.mu.Unlock()
		ps := e.parts[tp{p.Topic, p.Partition}]
		if ps == nil || ps.status != live {
			return // not ours (any more): the owner fetches them again
		}
		// Offsets only grow within an assignment; older ones mean the
		// client rewound (an offset reset). Records already admitted are
		// done or still tracked, so skipping them loses nothing.
		last := ps.win.End() - 1
		if ps.held.Len() > 0 {
			last = ps.held.lastOffset()
		}
		for len(meta) > 0 && meta[0].offset <= last {
			recs, meta = recs[1:], meta[1:]
		}
		if len(meta) == 0 {
			return
		}
		if ps.committed < 0 {
			// Commit the first window start even before anything
			// finishes: a crash then resumes here, not wherever
			// ConsumeResetOffset points.
			e.askCommit()
		}
		if ps.resumeAt >= 0 {
			if first := meta[0].offset; first < ps.resumeAt {
				// The committed offset was out of range (beyond the log
				// after a topic was recreated, or below its start after
				// retention) and the client reset to ConsumeResetOffset.
				e.log.Warn("kpar: committed offset out of range; consuming from the reset offset instead",
					"topic", ps.topic, "partition", ps.partition, "committed", ps.resumeAt, "reset_to", first)
			}
			ps.resumeAt = -1
		}
		for i := range meta {
			size := meta[i].size
			ps.bytes += size
			e.bytes += size
			e.pending++
		}
		readyBefore := e.ready.Len()
		if ps.held.Len() == 0 {
			room := min(len(meta), e.cfg.windowRecords-ps.win.Len())
			e.enterRecords(ps, recs[:room], meta[:room])
			recs, meta = recs[room:], meta[room:]
		}
		ps.held.push(recs, meta)
		ps.fetched = len(p.Records)
		// Keep records fetched ahead, so a draining window refills without
		// waiting for a fetch; pause beyond heldCap.
		if ps.held.Len() >= ps.heldCap(e.cfg.windowRecords) && !ps.heldFull {
			ps.heldFull = true
			e.syncPause(ps)
		}
		e.wake(e.ready.Len() - readyBefore)
	})
}

// recMeta is what prepare computes for a polled record, outside the lock.
// It holds no pointer, so held records cost the GC no scanning.
type recMeta struct {
	offset int64 // the record's offset: entering the window must not touch a cold record
	size   int64 // recordSize
	lane   uint64
}

// prepare computes, before the lock is taken, the offsets, sizes and, in
// key mode, the keys' hashes of one partition's polled records, so that
// entering the window (at once or later, from held) is bookkeeping only.
func (e *engine) prepare(recs []*kgo.Record) []recMeta {
	meta := make([]recMeta, len(recs))
	// Keys are hashed for the lanes of ByKey and for KeyRateLimit. Where
	// key mode may use wide lanes, a key is hashed only once its record
	// needs a key lane (laneOf): a cheap handler's records rarely do, and
	// reading every key costs a cache miss per record.
	keyed := e.cfg.ordering == ByKey || (e.rate != nil && e.rate.keys != nil)
	lazy := e.wideOK && e.cfg.ordering == ByKey
	for i, r := range recs {
		m := &meta[i]
		m.offset, m.size = r.Offset, recordSize(r)
		switch {
		case !keyed || r.Key == nil:
		case lazy:
			m.lane = unhashed
		default:
			m.lane = max(maphash.Bytes(e.seed, r.Key), unhashed+1)
		}
	}
	return meta
}

// enter appends a prepared record to ps's window, gives it its task and
// schedules it. Called with mu held.
func (e *engine) enter(ps *partState, rec *kgo.Record, m *recMeta) {
	if ps.skip != nil && ps.finishedBefore(m.offset) {
		// Finished before the last commit (its metadata said so): take
		// its place in the window, done, without running it.
		ps.win.Done(ps.win.Push(m.offset))
		ps.progress++
		ps.skipped++
		e.releaseBytes(ps, m.size)
		ps.tasks.retire(ps.win, &e.taskPool)
		return
	}
	seq := ps.win.Push(m.offset)
	t := ps.tasks.at(seq, &e.taskPool)
	initTask(t, ps, rec, seq, m.size, m.lane)
	if ps.level > 0 {
		if err := decodeRetry(&t.Value, ps.level); err != nil {
			r := t.Value.rec
			e.log.Warn("kpar: retry-topic record with bad kpar headers; handling it now as it is",
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
		}
	}
	e.schedule(t)
}

// budgetShare is a partition's fair share of MaxBufferedBytes. Called with
// mu held.
func (e *engine) budgetShare() int64 {
	return e.cfg.maxBytes / int64(max(1, len(e.parts)))
}

// pauseOverBudget pauses the partitions that hold more than their share of
// a used-up MaxBufferedBytes, and reports whether some live partition can
// still be fetched. Without it, records stuck in one partition (behind a
// retrying key, say) would hold the whole budget and stop the poller, and
// with it every other partition. Called with mu held.
func (e *engine) pauseOverBudget() bool {
	share, fetchable := e.budgetShare(), false
	for _, ps := range e.parts {
		if ps.status != live {
			continue
		}
		if !ps.overBudget && ps.bytes-ps.waiting > share {
			ps.overBudget = true
			e.syncPause(ps)
		}
		fetchable = fetchable || !ps.paused
	}
	return fetchable
}

// syncPause pauses or resumes fetching ps when its reasons to pause
// changed. Called with mu held.
func (e *engine) syncPause(ps *partState) {
	if want := ps.heldFull || ps.overBudget; want != ps.paused {
		ps.paused = want
		e.toggleFetch(fetchToggle{ps.tp, want, ps.win.Len(), true})
		if !want {
			e.wakePoller() // it may wait for bytes with every partition paused
		}
	}
}

// fetchErrorLog logs fetch errors at most once a second, with the count of
// those it held back since: a broker that fails every fetch (a deleted
// topic, a broker down) would otherwise log thousands of lines a second.
// It belongs to one polling goroutine.
type fetchErrorLog struct {
	log  *slog.Logger
	last time.Time
	held int
}

func (l *fetchErrorLog) Warn(msg string, attrs ...any) {
	now := time.Now()
	if now.Sub(l.last) < time.Second {
		l.held++
		return
	}
	if l.held > 0 {
		attrs = append(attrs, "similar_errors_not_logged", l.held)
	}
	l.last, l.held = now, 0
	l.log.Warn(msg, attrs...)
}

// fatalFetchError logs the errors of a poll and returns the first one that
// retrying cannot fix (see isFatal), for the engine and RunMembers alike.
// who prefixes the error's text and attrs the log lines.
func fatalFetchError(fs kgo.Fetches, log *fetchErrorLog, who string, attrs ...any) error {
	var fatal error
	fs.EachError(func(topic string, partition int32, err error) {
		switch {
		case errors.Is(err, context.Canceled):
		case errors.Is(err, kerr.InconsistentGroupProtocol):
			if fatal == nil {
				fatal = fmt.Errorf("%w (%v)", ErrOrderingMismatch, err)
			}
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

// fetchToggle is a decision, taken under mu, to pause or resume fetching a
// partition; the fetch controller applies it to the client and tells the
// hooks, outside the lock.
type fetchToggle struct {
	tp
	pause    bool
	buffered int  // the window's size when it was decided, for the hooks
	report   bool // call the paused/resumed hooks (not for a dropped partition)
}

// toggleFetch queues t for the fetch controller. Called with mu held.
func (e *engine) toggleFetch(t fetchToggle) {
	e.toggles = append(e.toggles, t)
	select {
	case e.toggleWake <- struct{}{}:
	default:
	}
}

// fetchController applies pause and resume decisions in the order they
// were taken, so that neither the client nor a user hook is ever called
// under the engine's lock. It runs until ctx ends.
func (e *engine) fetchController(ctx context.Context) {
	var todo []fetchToggle
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.toggleWake:
		}
		e.mu.Lock()
		todo, e.toggles = e.toggles, todo[:0]
		e.mu.Unlock()
		for _, t := range todo {
			parts := map[string][]int32{t.topic: {t.partition}}
			if t.pause {
				e.cl.PauseFetchPartitions(parts)
			} else {
				e.cl.ResumeFetchPartitions(parts)
			}
			if !t.report {
				continue
			}
			if t.pause {
				for _, h := range e.hooks.paused {
					h.OnPartitionPaused(t.topic, t.partition, t.buffered)
				}
			} else {
				for _, h := range e.hooks.resumed {
					h.OnPartitionResumed(t.topic, t.partition, t.buffered)
				}
			}
		}
		clear(todo)
	}
}
