package kpar

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar/internal/offsetmeta"
)

// The group's ordering mode. Members that order differently must not share
// a group: a member in unordered mode, given a partition that others handle
// by key, breaks the key's order. The classic protocol lets members compare
// a protocol name (orderedBalancer), but the consumer protocol (KIP-848) has
// no client metadata at all, so both protocols check the mode where it is
// durable: every commit's metadata names the committer's mode (offsetmeta,
// version 2), and a member reads it at each assignment, before it handles a
// record of the partitions it got.
//
// The rules, applied by checkOrdering:
//   - an assigned partition whose last commit names another mode is
//     refused;
//   - a partition with no commit yet (a new group, a new topic) has no mode
//     to compare; the group's mode then is the one its first committed
//     partition names (in topic and partition order), so that of two members
//     that started at once in different modes on fresh partitions, the one
//     of the other mode is refused at its next assignment;
//   - a mismatch while no other member is in the group is a change of mode,
//     made by stopping every member first: it is logged and allowed, and
//     the member commits its mode at once on every partition it got whose
//     commit names the old one (same offset, same finished set), so that
//     the members that join it later find the new mode.
//
// Only the partitions of the topics the member consumes count: the commits
// of a topic the group no longer reads do not hold its mode back.
//
// A refused member takes nothing of its assignment, and Run returns an
// error wrapping ErrOrderingMismatch that names both modes and a
// partition. CommitMetadataBytes(0) (plain commits) turns the check off.

// refusal is the error that ends a member refused by checkOrdering; the
// first one wins.
type refusal struct {
	once sync.Once
	err  error
	stop context.CancelFunc // stops the poller; set by deliver
	mu   sync.Mutex         // guards stop
}

// refuse ends the member's run with err.
func (r *refusal) refuse(err error) {
	r.once.Do(func() {
		r.mu.Lock()
		r.err = err
		stop := r.stop
		r.mu.Unlock()
		if stop != nil {
			stop()
		}
	})
}

// watch makes refuse stop the poller of ctx; it returns the poller's
// context.
func (r *refusal) watch(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		cancel()
	}
	r.stop = cancel
	return ctx
}

// error returns the refusal, nil for none.
func (r *refusal) error() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// checkOrdering applies the rules above to an assignment, given the
// group's committed offsets.
func (g *groupSource) checkOrdering(ctx context.Context, cl *kgo.Client, resps kadm.OffsetResponses, assigned map[string][]int32) error {
	e := g.e
	if e.cfg.commitMetadataBytes == 0 {
		return nil
	}
	ours := e.cfg.ordering
	type committed struct {
		topic     string
		partition int32
		mode      Order
	}
	var all []committed
	resps.Each(func(r kadm.OffsetResponse) {
		if r.Err != nil || r.At < 0 || !g.consumes(r.Topic, assigned) {
			return
		}
		if m, ok := offsetmeta.Mode(r.Metadata); ok {
			if o, ok := orderOfMeta(m); ok {
				all = append(all, committed{r.Topic, r.Partition, o})
			}
		}
	})
	if len(all) == 0 {
		return nil
	}
	slices.SortFunc(all, func(a, b committed) int {
		return cmp.Or(strings.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	bad := -1 // an assigned partition committed in another mode, else the group's first
	for i, c := range all {
		if c.mode != ours && slices.Contains(assigned[c.topic], c.partition) {
			bad = i
			break
		}
	}
	if bad < 0 && all[0].mode != ours {
		bad = 0
	}
	if bad < 0 {
		return nil
	}
	c := all[bad]
	others, err := g.otherMembers(ctx, cl)
	if err == nil && others == 0 {
		e.log.Warn("kpar: changing the group's ordering mode: its commits name another mode, and no other member is in the group",
			"group", e.cfg.group, "from", c.mode, "to", ours, "topic", c.topic, "partition", c.partition)
		g.recommitModes(ctx, cl, resps, assigned)
		return nil
	}
	return fmt.Errorf("%w: %s partition %d was committed by a member ordering by %s, and this member orders by %s (Ordering): use one ordering for every member of group %q; to change it, stop every member first",
		ErrOrderingMismatch, c.topic, c.partition, c.mode, ours, e.cfg.group)
}

// otherMembers counts the members of the group other than this one.
func (g *groupSource) otherMembers(ctx context.Context, cl *kgo.Client) (int, error) {
	me, _ := cl.GroupMetadata()
	adm := kadm.NewClient(cl)
	var ids []string
	if g.e.cfg.protocol == ConsumerProtocol {
		ds, err := adm.DescribeConsumerGroups(ctx, g.e.cfg.group)
		if err == nil {
			err = ds.Error()
		}
		if err == nil {
			for _, m := range ds[g.e.cfg.group].Members {
				ids = append(ids, m.MemberID)
			}
		}
		if err == nil || len(ids) > 0 {
			return countOthers(ids, me), nil
		}
		// A broker without the consumer protocol: franz-go fell back to
		// the classic one.
	}
	ds, err := adm.DescribeGroups(ctx, g.e.cfg.group)
	if err == nil {
		err = ds.Error()
	}
	if err != nil {
		return 0, err
	}
	for _, m := range ds[g.e.cfg.group].Members {
		ids = append(ids, m.MemberID)
	}
	return countOthers(ids, me), nil
}

func countOthers(ids []string, me string) int {
	n := 0
	for _, id := range ids {
		if id != me {
			n++
		}
	}
	return n
}

// consumes reports whether topic is one this member reads: one it names,
// or, by regex, one it got partitions of.
func (g *groupSource) consumes(topic string, assigned map[string][]int32) bool {
	if g.e.cfg.regex {
		_, ok := assigned[topic]
		return ok
	}
	return slices.Contains(g.e.cfg.topics, topic)
}

// recommitModes commits, at the same offset and with the same finished set,
// the assigned partitions whose commit names another mode than this
// member's: the group's mode changes with them. Best effort: a partition it
// misses takes the new mode with its next commit.
func (g *groupSource) recommitModes(ctx context.Context, cl *kgo.Client, resps kadm.OffsetResponses, assigned map[string][]int32) {
	e := g.e
	ours := e.cfg.ordering.metaMode()
	offsets := make(map[string]map[int32]kgo.EpochOffset)
	metas := make(map[string]map[int32]string)
	for topic, ps := range assigned {
		for _, p := range ps {
			r, ok := resps.Lookup(topic, p)
			if !ok || r.Err != nil || r.At < 0 {
				continue
			}
			if m, ok := offsetmeta.Mode(r.Metadata); !ok || m == ours {
				continue
			}
			_, runs, _ := offsetmeta.Decode(r.Metadata, r.At)
			meta, _ := offsetmeta.Encode(ours, r.At, runs, e.cfg.commitMetadataBytes)
			if offsets[topic] == nil {
				offsets[topic], metas[topic] = make(map[int32]kgo.EpochOffset), make(map[int32]string)
			}
			offsets[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: r.At}
			metas[topic][p] = meta
		}
	}
	if len(offsets) == 0 {
		return
	}
	withMeta := kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			for j := range t.Partitions {
				if m, ok := metas[t.Topic][t.Partitions[j].Partition]; ok {
					t.Partitions[j].Metadata = &m
				}
			}
		}
		return nil
	})
	// Before the partitions' states exist (onAssigned creates them after
	// the check): no commit of the settler's can hold them yet, and kgo
	// sends commits in the order they were made, so a later commit of a
	// higher offset cannot land first.
	cl.CommitOffsetsSync(withMeta, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			e.log.Warn("kpar: committing the new ordering mode failed; the partitions take it with their next commits", "err", err)
		}
	})
}

// nameModes adds both ordering modes to the refusal of a classic-protocol
// member (INCONSISTENT_GROUP_PROTOCOL names neither): the group's comes
// from the protocol it runs, "kpar-<mode>-<balancer>" for kpar members.
// Without an answer the refusal stays as it was.
func (g *groupSource) nameModes(ctx context.Context, refused error) error {
	c := g.e.cfg
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	groups, err := kadm.NewClient(g.cl).DescribeGroups(ctx, c.group)
	if err != nil {
		return refused
	}
	theirs := groups[c.group].Protocol
	if theirs == "" {
		return refused
	}
	mode := "none: its members are not kpar consumers"
	for _, o := range []Order{ByKey, ByPartition, Unordered} {
		if strings.HasPrefix(theirs, "kpar-"+o.String()+"-") {
			mode = o.String()
		}
	}
	return fmt.Errorf("%w: group %q has members ordering by %s (they run protocol %q), and this member orders by %s (Ordering); to change the group's ordering, stop every member first",
		refused, c.group, mode, theirs, c.ordering)
}
