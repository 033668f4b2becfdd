package kpar

import (
	"context"
	"time"

	"github.com/kpar/kpar/internal/window"
	"github.com/twmb/franz-go/pkg/kgo"
)

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
