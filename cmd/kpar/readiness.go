package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
)

// Readiness from progress. Being a member of the group (kparprom's Ready)
// is not enough: a member can be joined while nothing can be delivered (a
// broker restarted and the group has not fetched again, every dead-letter
// write refused, every request failing TLS verification). So /readyz also
// asks whether records finish: a member with work waiting that finished no
// record and moved no commit for the stall grace is not ready, and says
// why.
//
// Work waiting is what this member holds (records buffered, held or in
// flight; acquired records of a share group) or, when it holds nothing,
// the lag of its assigned partitions (the brokers' end offsets minus the
// group's committed offsets, from the start offset where none is
// committed; for a share group, the group's share-partition lag), listed
// every grace, within sampleInterval and lagInterval. Progress is a record
// finished or dead-lettered, or a commit that moved an offset. Both are
// sampled every sampleInterval.

const (
	// defaultReadyStall is the grace without progress unless --ready-stall
	// says otherwise or --attempt-timeout plus readyStallMargin is longer:
	// a single slow request must not make the member unready.
	defaultReadyStall = 15 * time.Second
	readyStallMargin  = 5 * time.Second
	sampleInterval    = time.Second
	lagInterval       = 5 * time.Second
	lagTimeout        = 3 * time.Second
	// errorExcerpt bounds the errors quoted in the readiness message.
	errorExcerpt = 200
)

// stallFlag is --ready-stall: a duration above 0, and whether it was given.
type stallFlag struct {
	d   time.Duration
	set bool
}

func (f *stallFlag) String() string {
	if !f.set {
		return ""
	}
	return f.d.String()
}

func (f *stallFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration, such as 30s")
	}
	if d <= 0 {
		return errors.New("want more than 0")
	}
	f.d, f.set = d, true
	return nil
}

// addReadyStall defines --ready-stall on fs.
func addReadyStall(fs *flagSet) *stallFlag {
	f := new(stallFlag)
	fs.Var(f, "ready-stall", fmt.Sprintf("with --metrics-listen, /readyz answers 503 when records wait (buffered, in flight, or lag on the assigned partitions) and none finished, was dead-lettered or was committed for `D` (default %v, or --attempt-timeout + %v when longer); the body says why", defaultReadyStall, readyStallMargin))
	return f
}

// grace is the stall grace: the flag's, else the default for attemptTimeout.
func (f *stallFlag) grace(attemptTimeout time.Duration) time.Duration {
	if f.set {
		return f.d
	}
	return max(defaultReadyStall, attemptTimeout+readyStallMargin)
}

// stallWatch tracks whether a Consumer makes progress. Pass its opts to
// kpar.New, then serveStatus runs it and asks it.
type stallWatch struct {
	grace time.Duration

	finished atomic.Int64 // records done or dead-lettered: the hooks' count
	commits  atomic.Int64 // commits that moved an offset
	attempt  atomic.Pointer[failure]
	sink     atomic.Pointer[failure]
	// refused is the first attempt the downstream refused for a
	// configuration error (kpar.Misconfigured: a certificate that stopped
	// verifying) since a record last finished, with the latest such
	// error; nil when a record finished since. The member is not ready
	// while it is set: records are held until an operator fixes it.
	refused atomic.Pointer[refusal]
	// brokers (brokerwatch.go) logs unreachable brokers and says when
	// they make the member not ready.
	brokers *brokerWatch                // nil for none
	cl      atomic.Pointer[groupClient] // the Consumer's client, for lag

	commitMu  sync.Mutex // guards committed
	committed map[string]map[int32]int64

	mu sync.Mutex // guards st
	st stallState

	// orphans sees records waiting on partitions this member does not
	// own (readiness_orphans.go).
	orphans orphanWatch
}

var (
	_ kpar.HookRecordDone       = (*stallWatch)(nil)
	_ kpar.HookDeadLettered     = (*stallWatch)(nil)
	_ kpar.HookDeadLetterFailed = (*stallWatch)(nil)
	_ kpar.HookAttemptFailed    = (*stallWatch)(nil)
	_ kpar.HookCommit           = (*stallWatch)(nil)

	_ kgo.HookNewClient    = stallClient{}
	_ kgo.HookClientClosed = stallClient{}
)

// failure is an error and when it happened.
type failure struct {
	at  time.Time
	err string
}

// groupClient is the Consumer's client and its group.
type groupClient struct {
	cl    *kgo.Client
	group string
	share bool
}

// stallState is what run last saw.
type stallState struct {
	sampled      bool
	waiting      int64     // records waiting
	what         string    // where they wait
	since        time.Time // start of the stall: the last progress, or the last moment nothing waited
	lastProgress time.Time // zero before the first
}

func newStallWatch(grace time.Duration) *stallWatch {
	return &stallWatch{grace: grace, committed: make(map[string]map[int32]int64)}
}

// opts are the options that let p observe a Consumer.
func (p *stallWatch) opts() []kpar.ConsumerOpt {
	return []kpar.ConsumerOpt{kpar.WithHooks(p), kpar.ClientOptions(kgo.WithHooks(stallClient{p}))}
}

// OnRecordDone implements kpar.HookRecordDone.
func (p *stallWatch) OnRecordDone(*kgo.Record, int, time.Duration) {
	p.finished.Add(1)
	if p.refused.Load() != nil {
		p.refused.Store(nil)
	}
}

// OnDeadLettered implements kpar.HookDeadLettered.
func (p *stallWatch) OnDeadLettered(deadletter.Letter) { p.finished.Add(1) }

// OnAttemptFailed implements kpar.HookAttemptFailed.
func (p *stallWatch) OnAttemptFailed(_ *kgo.Record, _ int, err error, _ time.Duration) {
	now := time.Now()
	p.attempt.Store(&failure{now, err.Error()})
	if kpar.IsMisconfigured(err) {
		since := now
		if r := p.refused.Load(); r != nil {
			since = r.since
		}
		p.refused.Store(&refusal{since: since, err: err.Error()})
	}
}

// refusal is a spell of attempts refused for a configuration error.
type refusal struct {
	since time.Time
	err   string // the latest
}

// OnDeadLetterFailed implements kpar.HookDeadLetterFailed.
func (p *stallWatch) OnDeadLetterFailed(_ int, err error) {
	p.sink.Store(&failure{time.Now(), err.Error()})
}

// OnCommit implements kpar.HookCommit: a commit that moves an offset is
// progress.
func (p *stallWatch) OnCommit(offsets map[string]map[int32]int64, err error) {
	if err != nil {
		return
	}
	p.commitMu.Lock()
	defer p.commitMu.Unlock()
	moved := false
	for t, ps := range offsets {
		if p.committed[t] == nil {
			p.committed[t] = make(map[int32]int64)
		}
		for part, o := range ps {
			if last, ok := p.committed[t][part]; !ok || o != last {
				p.committed[t][part], moved = o, true
			}
		}
	}
	if moved {
		p.commits.Add(1)
	}
}

// stallClient captures the Consumer's client (the one with a group:
// kpar builds others to validate options and to administer), kept off
// stallWatch so that it is not mistaken for a kgo hook.
type stallClient struct{ p *stallWatch }

func (h stallClient) OnNewClient(cl *kgo.Client) {
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != "" {
		h.p.cl.Store(&groupClient{cl: cl, group: g})
	} else if g, _ := cl.OptValue(kgo.ShareGroup).(string); g != "" {
		h.p.cl.Store(&groupClient{cl: cl, group: g, share: true})
	}
}

func (h stallClient) OnClientClosed(cl *kgo.Client) {
	if gc := h.p.cl.Load(); gc != nil && gc.cl == cl {
		h.p.cl.CompareAndSwap(gc, nil)
	}
}

// work is where run looks for records waiting; consumerWork is the real
// one.
type work struct {
	partitions func() []kpar.PartitionStats
	share      func() (kpar.ShareStats, bool)
	// list lists the group's offsets once for the lag of the assigned
	// partitions in owned and for the consumed partitions not in owned
	// (readiness_listing.go).
	list func(ctx context.Context, owned []kpar.PartitionStats) listing
}

func (p *stallWatch) consumerWork(c *kpar.Consumer) work {
	return p.clientWork(c.Partitions, c.ShareStats)
}

// clientWork is the work of partitions and share, listed through the
// Consumer's client.
func (p *stallWatch) clientWork(partitions func() []kpar.PartitionStats, share func() (kpar.ShareStats, bool)) work {
	return work{partitions: partitions, share: share, list: p.list}
}

// run samples progress and work every sampleInterval until ctx ends.
func (p *stallWatch) run(ctx context.Context, w work) {
	t := time.NewTicker(sampleInterval)
	defer t.Stop()
	s := &sampler{p: p, w: w, seen: -1}
	for {
		s.sample(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampler is what run keeps from one sample to the next, its goroutine's
// own.
type sampler struct {
	p          *stallWatch
	w          work
	seen       int64     // finished + commits at the last sample, -1 before the first
	lag        int64     // the lag last listed while this member held nothing
	lagChecked time.Time // when
}

// sample is one of run's samples, taken at now.
func (s *sampler) sample(ctx context.Context, now time.Time) {
	p, w := s.p, s.w
	n := p.finished.Load() + p.commits.Load()
	moved := s.seen >= 0 && n != s.seen
	s.seen = n

	var held int64
	stats := w.partitions()
	for _, ps := range stats {
		held += int64(ps.Buffered - ps.Finished + ps.Held)
	}
	st, share := w.share()
	if share {
		held += int64(st.Acquired)
	}
	// One listing serves the lag and the unowned partitions. Both are
	// due every orphanInterval (the grace, within sampleInterval and
	// lagInterval: listed every lagInterval, a stall that began after a
	// listing found no lag went unseen for up to 5s under a 1s grace, the
	// fault matrix's share member restarted after a kill -9), but not at
	// the same samples: the lag only while this member holds nothing, and
	// again at the next sample after a listing failed (the client not up
	// yet); the unowned partitions whether it holds records or not, a
	// failed listing counting as one, and never for a share group (its
	// lag is the group's already). So each keeps its own due time, and one
	// listing, taken when either is due, goes to both: an answer fresher
	// than its schedule asks for harms neither, and it brings them in
	// phase, so that an idle member lists once an interval, not twice. A
	// lag listed while records were held is not an idle member's: not kept.
	lagDue := held == 0 && now.Sub(s.lagChecked) >= orphanInterval(p.grace)
	orphansDue := !share && p.orphans.due(now, p.grace)
	if lagDue || orphansDue {
		lctx, cancel := context.WithTimeout(ctx, lagTimeout)
		l := w.list(lctx, stats)
		cancel()
		if held == 0 && l.lagKnown {
			s.lag, s.lagChecked = l.lag, now
		}
		if !share {
			p.orphans.note(now, l.unowned, l.unownedKnown)
		}
	}
	waiting, what := held, "held by this member"
	if held == 0 {
		waiting, what = s.lag, "not fetched yet"
	}

	p.mu.Lock()
	if moved {
		p.st.lastProgress = now
	}
	if moved || waiting == 0 || !p.st.sampled {
		p.st.since = now
	}
	p.st.sampled, p.st.waiting, p.st.what = true, waiting, what
	p.mu.Unlock()
}

// ready is membership (base: kparprom's Ready) and progress: not ready
// while records wait and none finished for the grace.
func (p *stallWatch) ready(base func() (bool, string)) (bool, string) {
	if why, bad := p.brokers.unreachable(); bad {
		return false, why
	}
	ok, why := base()
	if !ok {
		return false, why
	}
	if r := p.refused.Load(); r != nil {
		return false, fmt.Sprintf("the downstream refuses every attempt for a configuration error since %v ago, records are held until it is fixed: %s",
			time.Since(r.since).Round(time.Second), excerpt(r.err))
	}
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	if !st.sampled || st.waiting == 0 {
		return p.orphansReady(ok, why)
	}
	stalled := time.Since(st.since)
	if stalled < p.grace {
		return p.orphansReady(ok, why)
	}
	var b strings.Builder
	records := "records"
	if st.waiting == 1 {
		records = "record"
	}
	fmt.Fprintf(&b, "%d %s waiting (%s), none finished for %v", st.waiting, records, st.what, stalled.Round(time.Second))
	if st.lastProgress.IsZero() {
		b.WriteString(" (none since the start)")
	}
	// Only errors since the last progress explain the stall.
	if f := p.attempt.Load(); f != nil && !f.at.Before(st.lastProgress) {
		fmt.Fprintf(&b, "; last error: %s", excerpt(f.err))
	}
	if f := p.sink.Load(); f != nil && !f.at.Before(st.lastProgress) {
		fmt.Fprintf(&b, "; last dead-letter write failed: %s", excerpt(f.err))
	}
	return false, b.String()
}

// excerpt is the first line of s, at most errorExcerpt bytes.
func excerpt(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > errorExcerpt {
		s = strings.ToValidUTF8(s[:errorExcerpt], "") + "…"
	}
	return s
}
