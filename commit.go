package kpar

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar/internal/offsetmeta"
)

// The group source's settle: commits. The settler goroutine (settle.go)
// commits while Run consumes; revokes and the final commit call commit
// directly, and kgo serialises every commit of the client, so at most one
// is in flight and they land in order.
//
// Each partition's commit carries, in its metadata, the finished offsets
// above the start (package offsetmeta), so that after a crash or rebalance
// the next owner skips them.

// commitPart is one partition's share of a commit.
type commitPart struct {
	ps       *partState
	offset   int64
	progress uint64
	base     int64 // the window start the runs are above
	runs     []offsetmeta.Run
	limit    int // ps.metaLimit when the snapshot was taken
	meta     string
	covered  int // offsets the metadata covers
	cut      bool
}

// commit commits the window start of the given partitions (all live and
// revoking ones when only is nil), with the finished offsets above it in
// the metadata, where either changed since the last commit.
//
// Commits are serialised by g.commitMu from snapshot to response, so an older
// snapshot never lands after a newer one.
func (g *groupSource) commit(ctx context.Context, only []*partState) error {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	if g.e.out != nil && g.e.out.eos {
		// Every partition at once: the transaction's outputs are those of
		// every partition's finished records, so its commit must cover
		// them all.
		return g.commitTxn(ctx, nil)
	}
	retry, err := g.commitOnce(ctx, only)
	// Partitions whose metadata the broker refused as too large go again at
	// once with a smaller budget (halved each time, then plain).
	for range 8 {
		if len(retry) == 0 {
			break
		}
		var again error
		retry, again = g.commitOnce(ctx, retry)
		if again == nil {
			err = withoutTooLarge(err)
		}
	}
	return err
}

// commitOnce is one OffsetCommit; it returns the partitions to commit
// again with less metadata. Called with g.commitMu held.
func (g *groupSource) commitOnce(ctx context.Context, only []*partState) ([]*partState, error) {
	todo := g.snapshot(only)
	if len(todo) == 0 {
		return nil, nil
	}
	return g.commitParts(ctx, todo)
}

// snapshot takes what a commit of the given partitions (all live and
// revoking ones when only is nil) carries: each one's window start and
// the finished offsets above it, where either changed since the last
// commit. Called with g.commitMu held.
func (g *groupSource) snapshot(only []*partState) []commitPart {
	e := g.e
	e.mu.Lock()
	defer e.mu.Unlock()
	return g.snapshotLocked(only)
}

// snapshotLocked is snapshot, called with mu held too.
func (g *groupSource) snapshotLocked(only []*partState) []commitPart {
	e := g.e
	var todo []commitPart
	e.outcomes.Taken()
	add := func(ps *partState) {
		if ps.status == dropped {
			return
		}
		off, ok := ps.win.Start()
		if !ok || (off == ps.committed && ps.progress == ps.committedProg) {
			return
		}
		p := commitPart{ps: ps, offset: off, progress: ps.progress, base: off, limit: ps.metaLimit}
		if ps.metaLimit > 0 {
			ps.win.EachFinishedRun(func(from, to int64) {
				p.runs = append(p.runs, offsetmeta.Run{From: from, To: to})
			})
		}
		todo = append(todo, p)
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
	return todo
}

// encode encodes each part's metadata (outside the lock) and returns the
// offsets to commit, and the parts by partition.
func (g *groupSource) encode(todo []commitPart) (map[string]map[int32]kgo.EpochOffset, map[tp]*commitPart) {
	offsets := make(map[string]map[int32]kgo.EpochOffset)
	byTP := make(map[tp]*commitPart, len(todo))
	for i := range todo {
		p := &todo[i]
		var n int
		p.meta, n = offsetmeta.Encode(g.e.cfg.ordering.metaMode(), p.base, p.runs, p.limit)
		p.cut = n < len(p.runs)
		for _, r := range p.runs[:n] {
			p.covered += int(r.Len())
		}
		if offsets[p.ps.topic] == nil {
			offsets[p.ps.topic] = make(map[int32]kgo.EpochOffset)
		}
		offsets[p.ps.topic][p.ps.partition] = kgo.EpochOffset{Epoch: -1, Offset: p.offset}
		byTP[p.ps.tp] = p
	}
	return offsets, byTP
}

// commitRequestBytes is req's encoded size, for HookCommitRequest. The
// version is chosen when the request is sent; it is sized as v9, the
// flexible form Kafka 2.8 to 4.x brokers take.
func commitRequestBytes(req *kmsg.OffsetCommitRequest) int {
	sized := *req
	sized.Version = 9
	return len(sized.AppendTo(nil))
}

// commitParts commits todo with one OffsetCommit. Called with g.commitMu
// held.
func (g *groupSource) commitParts(ctx context.Context, todo []commitPart) ([]*partState, error) {
	e := g.e
	offsets, byTP := g.encode(todo)
	// kgo builds the request (member, generation, topic IDs and the
	// version they need); the metadata is ours. Without this hook kgo
	// writes its member ID there.
	var reqBytes, reqParts int
	withMeta := kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			reqParts += len(t.Partitions)
			for j := range t.Partitions {
				if p := byTP[tp{topic: t.Topic, partition: t.Partitions[j].Partition}]; p != nil {
					t.Partitions[j].Metadata = &p.meta
				}
			}
		}
		if len(e.hooks.commitReq) > 0 {
			reqBytes = commitRequestBytes(req)
		}
		return nil
	})

	asked := askedOffsets(todo)
	var commitErr error
	var tooLarge []*commitPart
	g.cl.CommitOffsetsSync(withMeta, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			commitErr = err
			asked = nil // the request failed: nothing was committed
			return
		}
		for _, t := range resp.Topics {
			for _, rp := range t.Partitions {
				tooLarge, commitErr = partitionCommitted(t.Topic, rp.Partition, rp.ErrorCode, asked, byTP, tooLarge, commitErr)
			}
		}
	})
	g.committed(todo, asked, tooLarge)
	for _, h := range e.hooks.commit {
		h.OnCommit(asked, commitErr)
	}
	for _, h := range e.hooks.commitReq {
		h.OnCommitRequest(reqParts, reqBytes, commitErr)
	}
	var retry []*partState
	for _, p := range tooLarge {
		retry = append(retry, p.ps)
	}
	return retry, commitErr
}

// askedOffsets is what todo asks to commit: topic -> partition -> offset.
func askedOffsets(todo []commitPart) map[string]map[int32]int64 {
	asked := make(map[string]map[int32]int64)
	for _, p := range todo {
		if asked[p.ps.topic] == nil {
			asked[p.ps.topic] = make(map[int32]int64)
		}
		asked[p.ps.topic][p.ps.partition] = p.offset
	}
	return asked
}

// partitionCommitted notes one partition's answer to a commit: a failed
// one leaves asked, and one refused for its metadata's size joins
// tooLarge.
func partitionCommitted(topic string, partition int32, code int16, asked map[string]map[int32]int64, byTP map[tp]*commitPart,
	tooLarge []*commitPart, commitErr error) ([]*commitPart, error) {
	err := kerr.ErrorForCode(code)
	if err == nil {
		return tooLarge, commitErr
	}
	delete(asked[topic], partition)
	if errors.Is(err, kerr.OffsetMetadataTooLarge) {
		if p := byTP[tp{topic: topic, partition: partition}]; p != nil {
			tooLarge = append(tooLarge, p)
		}
	}
	return tooLarge, errors.Join(commitErr, fmt.Errorf("%s/%d: %w", topic, partition, err))
}

// committed records, after a commit, the offsets that landed (asked) and
// halves the metadata budget of the partitions refused as too large.
func (g *groupSource) committed(todo []commitPart, asked map[string]map[int32]int64, tooLarge []*commitPart) {
	e := g.e
	e.mu.Lock()
	for i := range todo {
		p := &todo[i]
		if _, ok := asked[p.ps.topic][p.ps.partition]; !ok {
			continue
		}
		if p.offset >= p.ps.committed {
			p.ps.committed = p.offset
			p.ps.committedProg = p.progress
			p.ps.committedMeta, p.ps.metaCut = p.covered, p.cut
			p.ps.committedAt, p.ps.committedText = p.offset, p.meta
		}
	}
	for _, p := range tooLarge {
		// The broker's offset.metadata.max.bytes is below ours: halve the
		// budget (down to plain commits) and commit again at once.
		p.ps.metaLimit /= 2
		if p.ps.metaLimit < len(offsetmeta.Prefix)+8 {
			p.ps.metaLimit = 0
		}
		p.limit = p.ps.metaLimit // for the log, outside the lock
	}
	e.mu.Unlock()
	for _, p := range tooLarge {
		e.log.Warn("kpar: broker refused the commit metadata as too large; committing with a smaller finished-offsets set",
			"topic", p.ps.topic, "partition", p.ps.partition, "bytes", len(p.meta), "new_limit", p.limit)
	}
}

// withoutTooLarge drops OFFSET_METADATA_TOO_LARGE errors from a joined
// commit error, once the smaller commit that followed succeeded.
func withoutTooLarge(err error) error {
	var keep []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !errors.Is(e, kerr.OffsetMetadataTooLarge) {
				keep = append(keep, e)
			}
		}
	} else if err != nil && !errors.Is(err, kerr.OffsetMetadataTooLarge) {
		keep = append(keep, err)
	}
	return errors.Join(keep...)
}
