package kpar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

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
