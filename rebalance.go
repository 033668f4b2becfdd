package kpar

import (
	"context"
	"errors"
	"time"

	"github.com/kpar/kpar/internal/offsetmeta"
	"github.com/kpar/kpar/internal/window"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// onAssigned creates the state of newly assigned partitions. kgo calls it
// before it fetches their committed offsets and starts fetching records, so
// the finished sets read here are in place before the first record.
func (g *groupSource) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	e := g.e
	g.joined.Store(true)
	committed, finished, resps := g.readCommitted(ctx, cl, assigned)
	if len(assigned) > 0 && resps != nil {
		if err := g.checkOrdering(ctx, cl, resps, assigned); err != nil {
			// Nothing of the assignment is taken: its records are not
			// handled, nor its offsets committed, by this member.
			e.log.Error("kpar: refusing the assignment: another ordering mode", "err", err)
			g.refusal.refuse(err)
			return
		}
	}
	// What this member finished before it lost a partition is finished
	// still. Taken before engine.mu: lostWork's lock is never nested in it.
	if e.out != nil && e.out.eos {
		g.awaitLostOutputs(ctx, assigned)
	}
	states := make(map[tp]*partState)
	for topic, ps := range assigned {
		for _, p := range ps {
			k := tp{topic: topic, partition: p}
			s := &partState{
				tp:        k,
				level:     e.retryTo.LevelOf(topic),
				win:       window.New(e.cfg.windowRecords),
				committed: -1,
				metaLimit: e.cfg.commitMetadataBytes,
				skip:      finished[k],
				resumeAt:  -1,
				// firstAdmitted: set by the first fetch (admitPartition).
				firstAdmitted: -1,
				committedAt:   -1,
			}
			if at, ok := committed[k]; ok {
				s.resumeAt = at
				if e.out != nil && e.out.eos {
					r, _ := resps.Lookup(topic, p)
					s.committedAt, s.committedText = at, r.Metadata
					s.skip, s.kept = g.lost.takeTxn(k, s, finished[k], at, r.Metadata)
				} else {
					s.skip = g.lost.take(k, finished[k], at)
				}
			}
			states[k] = s
		}
	}
	e.mu.Lock()
	for k, s := range states {
		if old := e.parts[k]; old != nil {
			e.dropLocked(old)
		}
		e.parts[k] = s
	}
	e.mu.Unlock()
	g.shareStale.Store(true)
	if len(assigned) > 0 {
		e.settleAfresh() // the group answers: commit without an outage's backoff
		// An empty assignment (an idle member, or a rebalance that moved
		// nothing here) still reaches the hooks: readiness counts it.
		e.log.Info("kpar: partitions assigned", "assigned", assigned)
	}
	for _, h := range e.hooks.assigned {
		h.OnPartitionsAssigned(assigned)
	}
}

// onRevoked stops dispatching the revoked partitions, waits up to
// RevokeTimeout for their running records, commits their window starts and
// drops their state.
func (g *groupSource) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	e := g.e
	var (
		revokingParts []*partState
		idle          []chan struct{}
	)
	e.mu.Lock()
	for topic, ps := range revoked {
		for _, p := range ps {
			s := e.parts[tp{topic: topic, partition: p}]
			if s == nil || s.status != live {
				continue
			}
			s.status = revoking
			e.stopRuns(s)
			revokingParts = append(revokingParts, s)
			if s.running > 0 {
				s.idle = make(chan struct{})
				idle = append(idle, s.idle)
			}
		}
	}
	e.mu.Unlock()

	if e.closing.Load() {
		idle = nil // the shutdown drain waited for them already, within its bound
	}
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
	if err := g.commit(ctx, revokingParts); err != nil {
		e.log.Warn("kpar: commit on revoke failed; the new owner may handle some records again", "err", err)
	}
	e.mu.Lock()
	for _, s := range revokingParts {
		e.dropLocked(s)
	}
	e.mu.Unlock()
	g.shareStale.Store(true)
	e.log.Info("kpar: partitions revoked", "revoked", revoked)
	for _, h := range e.hooks.revoked {
		h.OnPartitionsRevoked(revoked, false)
	}
}

// onLost drops lost partitions without committing: another member may own
// them already.
func (g *groupSource) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	e := g.e
	kept := make(map[tp][]offsetmeta.Run)
	keptTxn := make(map[tp]*keptTxn)
	e.mu.Lock()
	for topic, ps := range lost {
		for _, p := range ps {
			if s := e.parts[tp{topic: topic, partition: p}]; s != nil {
				switch {
				case s.status != live:
				case e.out == nil || !e.out.eos:
					kept[s.tp] = finishedOf(s)
				default:
					keptTxn[s.tp] = g.keptTxnOf(s)
				}
				e.dropLocked(s)
			}
		}
	}
	e.mu.Unlock()
	for k, runs := range kept {
		g.lost.keep(k, runs)
	}
	for k, w := range keptTxn {
		g.lost.keepTxn(k, w, e.cfg.maxBytes)
	}
	if len(lost) == 0 {
		return // kgo reports an empty loss on every group error while the brokers are down
	}
	g.shareStale.Store(true)
	e.log.Warn("kpar: partitions lost: dropped without a commit; their new owner handles their unfinished records", "lost", lost)
	for _, h := range e.hooks.revoked {
		h.OnPartitionsRevoked(lost, true)
	}
}

// forgetTopic drops every partition of a topic the broker no longer has,
// without committing: their offsets belong to the deleted topic, and a
// commit sent once the client resolves the name again would land on the
// new topic of that name and skip its records.
func (g *groupSource) forgetTopic(topic string) {
	e := g.e
	g.ids.forget(topic)
	g.lost.forget(topic)
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, ps := range e.parts {
		if k.topic == topic {
			e.dropLocked(ps)
		}
	}
}

// dropLocked releases a partition's state. Its queued records are skipped
// when popped, its retry timers stopped, and late completions ignored.
func (e *engine) dropLocked(ps *partState) {
	if ps.status == dropped {
		return
	}
	ps.status = dropped
	e.stopRuns(ps)
	wasPaused := e.buf.Drop(&ps.buf, ps.win.Pending()+ps.held.Len())
	ps.held.reset()
	ps.over.reset() // never admitted: the next owner fetches them
	e.retries.Forget(func(t *task) bool { return t.Value.part == ps }, stopRetry)
	if wasPaused {
		e.toggleFetch(fetchToggle{ps, false, 0, false})
	}
	if e.parts[ps.tp] == ps {
		delete(e.parts, ps.tp)
	}
	e.budgetFreed()
}

// readCommitted reads the committed offsets of the assigned partitions with
// their metadata and decodes the finished sets kpar stored there. Anything
// it cannot read or decode (a failed request, metadata of another client,
// a future version) means nothing is skipped: those records are handled
// again, never lost.
func (g *groupSource) readCommitted(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) (map[tp]int64, map[tp][]offsetmeta.Run, kadm.OffsetResponses) {
	e := g.e
	if len(assigned) == 0 {
		return nil, nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resps, err := kadm.NewClient(cl).FetchOffsets(ctx, e.cfg.group)
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		e.log.Warn("kpar: reading the finished offsets of the last commit failed; records finished above the committed offsets will be handled again", "err", err)
		return nil, nil, nil
	}
	at := make(map[tp]int64)
	out := make(map[tp][]offsetmeta.Run)
	for topic, parts := range assigned {
		for _, p := range parts {
			r, ok := resps.Lookup(topic, p)
			if !ok || r.At < 0 {
				continue
			}
			at[tp{topic: topic, partition: p}] = r.At
			if r.Metadata == "" || e.cfg.commitMetadataBytes == 0 {
				continue
			}
			_, runs, err := offsetmeta.Decode(r.Metadata, r.At)
			if err != nil {
				if !errors.Is(err, offsetmeta.ErrNotKpar) {
					e.log.Warn("kpar: unreadable finished-offsets metadata; handling every record from the committed offset",
						"topic", topic, "partition", p, "offset", r.At, "err", err)
				}
				continue
			}
			out[tp{topic: topic, partition: p}] = runs
		}
	}
	return at, out, resps
}

// orderedBalancer is the cooperative-sticky balancer under a protocol name
// that carries the ordering mode ("kpar-key-cooperative-sticky"). A group
// only admits members that share a protocol name, so a member started with
// another ordering (which would silently break per-key order on the
// partitions it gets) is refused with INCONSISTENT_GROUP_PROTOCOL, and Run
// returns ErrOrderingMismatch. The price: a kpar group cannot be shared
// with plain consumers; set kgo.Balancers in ClientOptions to opt out.
type orderedBalancer struct {
	kgo.GroupBalancer
	ordering Order
}

func (b orderedBalancer) ProtocolName() string {
	return "kpar-" + b.ordering.String() + "-" + b.GroupBalancer.ProtocolName()
}
