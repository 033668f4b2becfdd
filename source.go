package kpar

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// One pipeline, three sources. Everything between where records come from
// and where their outcomes go is the engine's, shared by every way of
// consuming: scheduling and ordering, workers and attempt contexts,
// retries and backoff, Overloaded and the breaker, the adaptive limit, the
// rate limits, the stuck guard, dead letters and retry topics, and the
// shutdown bound. A source is only the part that differs:
//
//   - groupSource (group.go, commit.go, rebalance.go, budget.go, txn.go):
//     a consumer group member. It delivers polled records into partition
//     windows and takes outcomes back as commits of each window start plus
//     the finished offsets above it.
//   - shareSource (sharesource.go; its options in share.go): a share group
//     member (KIP-932). It delivers acquired records and takes outcomes
//     back as ACCEPT and RELEASE acknowledgements, renewing the acquisition
//     locks meanwhile.
//   - rangeSource (rangesource.go; Backfill in backfill.go): range
//     readers, several per partition, each assigned at its slice's offset.
//     It delivers slices of a fixed range and takes outcomes back as the
//     progress file.
//
// Each source gets the same engine, built whole by newEngine; a rule that
// cannot apply to a source is refused when the consumer is built, never
// ignored (cfg.validate).
//
// A source may also be an acknowledger, whose records are acknowledged
// one by one and withdrawn at shutdown, and a producer, which writes
// retry-topic records: newEngine asks once.
type source interface {
	// open connects, before any record or goroutine of the pipeline. An
	// error ends Run (or Backfill) at once.
	open(ctx context.Context) error
	// deliver feeds records into the pipeline (engine.acceptWithin) until ctx
	// ends, the source has nothing more to deliver (a range is done), or
	// on a fatal error, which it returns.
	deliver(ctx context.Context) error
	// settle takes back the outcomes of finished records: a commit,
	// acknowledgements, a progress save. The settler goroutine calls it
	// when records finished (askCommit), at most once per settleEvery.
	settle(ctx context.Context) error
	// settleEvery is the least time between two settles.
	settleEvery() time.Duration
	// pause applies a decision, taken under the pipeline's lock, to pause
	// or resume fetching ps. The fetch controller calls it outside the
	// lock, in the order the decisions were taken.
	pause(ps *partState, paused bool)
	// stopping is called when shutdown begins, after deliver returned and
	// before the pipeline drains.
	stopping()
	// close ends the source by deadline, once the workers stopped: the
	// last settle, leaving the group, closing the clients. It returns the
	// last settle's error, which Run reports as ErrFinalCommit.
	close(ctx context.Context, deadline time.Time) error
}

// acknowledger is a source that acknowledges each record (share groups):
// finished records are kept for its settle as ACCEPT, withdrawn ones as
// RELEASE. keepAtShutdown says which records must run all the same when
// the others are withdrawn; it is called with engine.mu held.
type acknowledger interface {
	source
	keepAtShutdown(*kgo.Record) bool
}

// producer writes retry-topic records (retrytopics.go).
type producer interface {
	ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults
}

// ProduceSync produces through the member's client, which open made
// before any of the pipeline's goroutines started.
func (g *groupSource) ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	return g.cl.ProduceSync(ctx, rs...)
}
