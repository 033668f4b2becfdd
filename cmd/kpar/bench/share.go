package bench

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar"
)

// The share scenario: the three ways kpar reads past the partition count,
// on one topic of ONE partition. The consumer-group engine keeps many
// records of the partition in flight behind one commit point; backfill
// runs N assigned readers over slices of the partition (no group); a share
// group lets the broker hand the partition's records to its members and
// acknowledges each record. raw-share is a plain franz-go share consumer
// (poll, handle each record in turn, accept them all at the next poll):
// the published anchor of about 4,700 records/s on a laptop.
const Share = "share"

// Contenders of the share scenario only.
const (
	KparShare = "kpar-share"
	RawShare  = "raw-share"
	Backfill1 = "backfill-1"
	Backfill2 = "backfill-2"
	Backfill4 = "backfill-4"
)

// ShareContenders lists the contenders of the share scenario beside
// kpar-unordered: they read without a consumer group, so the scenarios of
// Contenders do not run them.
func ShareContenders() []string {
	return []string{KparShare, RawShare, Backfill1, Backfill2, Backfill4}
}

// AllContenders is Contenders and ShareContenders.
func AllContenders() []string { return append(Contenders(), ShareContenders()...) }

func shareContender(name string) (contender, bool) {
	switch name {
	case KparShare:
		return contender{name, one, true, runKparShare, settleShare}, true
	case RawShare:
		return contender{name, one, true, runRawShare, settleShare}, true
	case Backfill1:
		return contender{name, one, true, runBackfill(1), settleFetch}, true
	case Backfill2:
		return contender{name, one, true, runBackfill(2), settleFetch}, true
	case Backfill4:
		return contender{name, one, true, runBackfill(4), settleFetch}, true
	}
	return contender{}, false
}

// settleShare waits until the share member's first ShareFetch is held at
// the gate: it joined and was assigned the partition.
func settleShare(ctx context.Context, g *gate, stop <-chan error) error {
	return g.await(ctx, g.shareFetched, stop)
}

// settleFetch waits until a backfill reader's first Fetch is held at the
// gate.
func settleFetch(ctx context.Context, g *gate, stop <-chan error) error {
	return g.await(ctx, g.fetched, stop)
}

func runKparShare(ctx context.Context, e *env) error {
	c, err := kpar.New(kpar.HandlerFunc(e.handle),
		kpar.Brokers(e.brokers...),
		kpar.ShareGroup(e.group),
		kpar.Topics(e.topic),
		kpar.Concurrency(e.concurrency),
		kpar.Ordering(kpar.Unordered),
		kpar.ClientOptions(e.kgoOpts...),
	)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// runRawShare is the plain franz-go share consumer: poll, handle each
// record in turn; the next poll accepts them all.
func runRawShare(ctx context.Context, e *env) error {
	cl, err := kgo.NewClient(append(e.kgoOpts, kgo.SeedBrokers(e.brokers...))...)
	if err != nil {
		return err
	}
	err = setEarliest(ctx, cl, e.group)
	cl.Close()
	if err != nil {
		return err
	}
	return pollEach(ctx, e, kgo.ShareGroup(e.group))
}

// setEarliest makes a new share group start at the oldest record, as kpar
// does for its own (the scenario's topic is loaded before the run).
func setEarliest(ctx context.Context, cl *kgo.Client, group string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	rr.ResourceName = group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Op, c.Value = "share.auto.offset.reset", kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr("earliest")
	rr.Configs = append(rr.Configs, c)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) > 0 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("setting share.auto.offset.reset on %s: %w", group, err)
	}
	return nil
}

// runBackfill reads the whole topic with kpar.Backfill and n readers per
// partition, then waits for the end of the run: a contender returning
// early counts as stopped.
func runBackfill(n int) func(ctx context.Context, e *env) error {
	return func(ctx context.Context, e *env) error {
		_, err := kpar.Backfill(ctx, kpar.HandlerFunc(e.handle),
			kpar.Range{Topic: e.topic, From: kpar.AtOffset(0), To: kpar.AtOffset(e.end)},
			kpar.Brokers(e.brokers...),
			kpar.Readers(n),
			kpar.Concurrency(e.concurrency),
			kpar.ClientOptions(e.kgoOpts...),
		)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
}

// share runs the share scenario: noop and Latency handlers, every contender
// on the same one-partition topic, each capped at TimeCap.
func (r *runner) share(ctx context.Context) ([]Result, error) {
	t, err := r.topic(ctx, "share", 1, 0, r.cfg.ValueBytes, r.records(100_000))
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, v := range []struct {
		name        string
		work        work
		concurrency int
	}{
		{"noop", noWork, defaultConcurrency},
		{r.cfg.Latency.String(), sleepWork(r.cfg.Latency), r.cfg.Concurrency},
	} {
		var rs []Result
		for _, c := range r.contenders(KparUnordered, Backfill1, Backfill2, Backfill4, KparShare, RawShare) {
			rs = append(rs, r.measure(ctx, runSpec{scenario: Share, variant: v.name, c: c, t: t, work: v.work,
				concurrency: v.concurrency, cap: r.cfg.TimeCap}))
			if ctx.Err() != nil {
				return append(out, rs...), ctx.Err()
			}
		}
		// Ratios to the plain share consumer; the notes compare with the
		// consumer-group engine.
		base, engine := find(rs, RawShare, v.name), find(rs, KparUnordered, v.name)
		for i := range rs {
			res := &rs[i]
			if base != nil && base.Err == "" && base.RecordsPerSec > 0 {
				res.Ratio, res.RatioTo = res.RecordsPerSec/base.RecordsPerSec, "raw-share"
			}
			if engine != nil && engine.Err == "" && engine.RecordsPerSec > 0 && res != engine {
				res.Note = join(res.Note, fmt.Sprintf("%.2f× kpar-unordered", res.RecordsPerSec/engine.RecordsPerSec))
			}
		}
		out = append(out, rs...)
	}
	return out, nil
}

// await waits for ch (closed by the gate) or fails when ctx ends or the
// contender stops first.
func (g *gate) await(ctx context.Context, ch <-chan struct{}, stop <-chan error) error {
	select {
	case <-ch:
		return nil
	case err := <-stop:
		return fmt.Errorf("the contender stopped before it fetched: %v", err)
	case <-ctx.Done():
		return fmt.Errorf("the contender did not fetch: %w", ctx.Err())
	}
}
