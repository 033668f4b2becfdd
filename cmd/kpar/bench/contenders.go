package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// env is what one contender run gets: where to consume, and the handler
// that does the scenario's work and counts the record.
type env struct {
	brokers     []string
	topic       string
	end         int64 // offset after the last record of a one-partition topic (backfill's range)
	group       string
	partitions  int
	concurrency int
	// commitEvery is kpar's CommitInterval and naive-pool's commit
	// period; 0 keeps kpar's default (5ms) and uses 1s for naive-pool.
	commitEvery time.Duration
	handle      func(ctx context.Context, r *kgo.Record) error
	// kgoOpts go to every franz-go client of the run (the latency stamp
	// hook and the heartbeat interval).
	kgoOpts      []kgo.Opt
	heartbeat    time.Duration
	fetchMaxWait time.Duration // sarama's MaxWaitTime when set
}

// contender is one way of consuming. run consumes until ctx ends, shuts
// down the way that contender does, and returns.
type contender struct {
	name string
	// members is how many group members the contender runs.
	members func(partitions int) int
	// stamps: its client runs stampHook, so latency can be measured.
	stamps bool
	run    func(ctx context.Context, e *env) error
	// settle, when set, replaces waiting for a stable consumer group
	// (contenders without one: share.go); it waits at the closed gate.
	settle func(ctx context.Context, g *gate, stop <-chan error) error
}

// Contender names, in report order.
const (
	Raw           = "raw"
	PerPartition  = "per-partition"
	NaivePool     = "naive-pool"
	BatchPool     = "batch-pool"
	KparKey       = "kpar-key"
	KparPartition = "kpar-partition"
	KparUnordered = "kpar-unordered"
	Sarama        = "sarama"
)

// Contenders lists every contender name of this build: sarama only when
// built with -tags sarama (see sarama.go).
func Contenders() []string {
	names := []string{Raw, PerPartition, NaivePool, BatchPool, KparKey, KparPartition, KparUnordered}
	if runSarama != nil {
		names = append(names, Sarama)
	}
	return names
}

func one(int) int { return 1 }

// runSarama is set by sarama.go, built only with -tags sarama: the sarama
// contender would otherwise make every kpar binary (and the first `go run
// ./cmd/kpar demo`) download and build sarama and its Kerberos stack.
var runSarama func(context.Context, *env) error

func contenderNamed(name string) (contender, bool) {
	switch name {
	case Raw:
		return contender{name, one, true, runRaw, nil}, true
	case PerPartition:
		return contender{name, func(p int) int { return p }, true, runPerPartition, nil}, true
	case NaivePool:
		return contender{name, one, true, runPool(1), nil}, true
	case BatchPool:
		return contender{name, one, true, runPool(batchPoolRun), nil}, true
	case KparKey:
		return contender{name, one, true, runKpar(kpar.ByKey), nil}, true
	case KparPartition:
		return contender{name, one, true, runKpar(kpar.ByPartition), nil}, true
	case KparUnordered:
		return contender{name, one, true, runKpar(kpar.Unordered), nil}, true
	case Sarama:
		return contender{name, one, false, runSarama, nil}, runSarama != nil
	}
	return shareContender(name)
}

// runRaw is the ceiling: one franz-go client, one loop that polls and calls
// the handler on each record in turn, franz-go's default autocommit.
func runRaw(ctx context.Context, e *env) error {
	return pollEach(ctx, e, kgo.ConsumerGroup(e.group))
}

// pollEach is the loop of the plain franz-go contenders: one client in
// group (a consumer or a share group), polling and calling the handler on
// each record in turn until ctx ends.
func pollEach(ctx context.Context, e *env, group kgo.Opt) error {
	cl, err := kgo.NewClient(append(e.kgoOpts,
		kgo.SeedBrokers(e.brokers...),
		group,
		kgo.ConsumeTopics(e.topic),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		fs.EachRecord(func(r *kgo.Record) { _ = e.handle(ctx, r) })
	}
}

// runPerPartition is the "consumer per goroutine" model: one group member
// per partition, each handling its records sequentially (kpar.RunMembers).
func runPerPartition(ctx context.Context, e *env) error {
	return kpar.RunMembers(ctx, e.partitions, kpar.HandlerFunc(e.handle),
		kpar.Brokers(e.brokers...),
		kpar.Group(e.group),
		kpar.Topics(e.topic),
		kpar.ClientOptions(e.kgoOpts...),
	)
}

func runKpar(o kpar.Order) func(ctx context.Context, e *env) error {
	return func(ctx context.Context, e *env) error {
		opts := []kpar.ConsumerOpt{
			kpar.Brokers(e.brokers...),
			kpar.Group(e.group),
			kpar.Topics(e.topic),
			kpar.Concurrency(e.concurrency),
			kpar.Ordering(o),
			kpar.ClientOptions(e.kgoOpts...),
		}
		if e.commitEvery > 0 {
			opts = append(opts, kpar.CommitInterval(e.commitEvery))
		}
		c, err := kpar.New(kpar.HandlerFunc(e.handle), opts...)
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
}

// batchPoolRun is how many records of a partition batch-pool hands a
// worker at once.
const batchPoolRun = 256

// runPool is the thread-pool design kpar replaces: one poller hands
// records to a bounded pool of workers — running them itself when the
// pool's queue is full (caller-runs back-pressure) — and a committer
// periodically commits, per partition, the highest offset any worker
// finished. A slow record overtaken by faster ones is committed past: the
// loss the crash scenario shows. naive-pool hands over one record at a
// time (run 1); batch-pool hands over runs of up to batchPoolRun records
// of one partition, which a worker handles one after the other: in noop
// it shows what the per-record hand-off itself costs.
func runPool(run int) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error { return pool(ctx, e, run) }
}

func pool(ctx context.Context, e *env, run int) error {
	cl, err := kgo.NewClient(append(e.kgoOpts,
		kgo.SeedBrokers(e.brokers...),
		kgo.ConsumerGroup(e.group),
		kgo.ConsumeTopics(e.topic),
		kgo.DisableAutoCommit(),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()

	var (
		done = &poolOffsets{m: map[string]map[int32]*atomic.Int64{}}
		jobs = make(chan poolJob, e.concurrency)
		wg   sync.WaitGroup
	)
	hctx := context.WithoutCancel(ctx)
	for range e.concurrency {
		wg.Go(func() {
			for j := range jobs {
				j.run(hctx, e)
			}
		})
	}
	stopCommitter := done.commitEvery(ctx, cl, e.commitEvery)
	for {
		fs := cl.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			m := done.of(p.Topic, p.Partition)
			for rs := p.Records; len(rs) > 0; {
				j := poolJob{rs[:min(run, len(rs))], m}
				rs = rs[len(j.rs):]
				select {
				case jobs <- j:
				default:
					j.run(hctx, e) // caller runs
				}
			}
		})
	}
	close(jobs)
	wg.Wait()
	stopCommitter()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	done.commit(fctx, cl)
	return nil
}

// poolJob is a run of one partition's records, in offset order, and the
// partition's highest finished offset.
type poolJob struct {
	rs  []*kgo.Record
	max *atomic.Int64
}

// run handles the records, raising max past each.
func (j poolJob) run(ctx context.Context, e *env) {
	for _, r := range j.rs {
		_ = e.handle(ctx, r)
		next := r.Offset + 1
		for cur := j.max.Load(); next > cur && !j.max.CompareAndSwap(cur, next); cur = j.max.Load() {
		}
	}
}

// poolOffsets are a pool's highest finished offsets (plus one) per
// partition, which it commits.
type poolOffsets struct {
	mu sync.Mutex // guards m (not the counters)
	m  map[string]map[int32]*atomic.Int64
}

// of is the counter of a partition.
func (o *poolOffsets) of(topic string, p int32) *atomic.Int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m[topic] == nil {
		o.m[topic] = map[int32]*atomic.Int64{}
	}
	c := o.m[topic][p]
	if c == nil {
		c = new(atomic.Int64)
		o.m[topic][p] = c
	}
	return c
}

// commit commits the offsets.
func (o *poolOffsets) commit(ctx context.Context, cl *kgo.Client) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	o.mu.Lock()
	for t, ps := range o.m {
		for p, m := range ps {
			if off := m.Load(); off > 0 {
				if offsets[t] == nil {
					offsets[t] = map[int32]kgo.EpochOffset{}
				}
				offsets[t][p] = kgo.EpochOffset{Epoch: -1, Offset: off}
			}
		}
	}
	o.mu.Unlock()
	if len(offsets) > 0 {
		cl.CommitOffsetsSync(ctx, offsets, nil)
	}
}

// commitEvery commits every interval (default 1s) until stop returns.
func (o *poolOffsets) commitEvery(ctx context.Context, cl *kgo.Client, every time.Duration) (stop func()) {
	if every <= 0 {
		every = time.Second
	}
	commitCtx, stopCommitter := context.WithCancel(context.WithoutCancel(ctx))
	var committer sync.WaitGroup
	committer.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-commitCtx.Done():
				return
			case <-t.C:
				o.commit(commitCtx, cl)
			}
		}
	})
	return func() {
		stopCommitter()
		committer.Wait()
	}
}
