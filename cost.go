package kpar

import "time"

// The handler-cost model: the one place that decides, from what the
// handler costs per record, which path a record takes through the
// pipeline. Every other file asks it; none keeps a threshold of its own.
//
// Workers measure the handler's time per record (runEach) and report it
// here (measured). Two thresholds split the measure into three bands:
//
//   - slow, at or above cheapBelow (20µs): every record is a task of its
//     own, with an attempt context of its own, handed out through the
//     ready queue; every worker may be awake. The handler dominates, and
//     parallelism within a partition is what kpar is for.
//   - cheap, below cheapBelow: a worker runs its records with one shared
//     attempt context and one clock reading, and runs its lane's next
//     record itself instead of queueing it (runEach); at most GOMAXPROCS
//     workers are awake (awake.go), since more cannot run at once and only
//     queue at the pipeline's lock. In kpar bench noop the awake cap cut
//     25-40ns of CPU a record (BENCHMARKS.md, eighth pass), and the shared
//     context saves a context and a clock reading a record, which cost more
//     than such a handler.
//   - tiny, below tinyBelow (5µs): on top of that, a key or unordered
//     partition orders its records on one wide lane (widelane.go) instead of
//     a lane per key, and records enter a partition's lane in record runs of
//     up to 64 under one task (run.go). There the per-record bookkeeping, not
//     the handler, is what limits throughput: wide lanes saved 50-70ns a
//     record in key mode (ninth pass), and runs took kpar bench noop from
//     0.83x to 0.94x the raw franz-go loop (twelfth pass). Above 5µs, a
//     wide lane's lost parallelism within a partition costs more than that:
//     kpar bench cpu (10µs, one partition) measured 1.36-1.72x raw with wide
//     lanes open at 20µs against 1.52-1.65x without them.
//
// Until a worker measured the handler, records take the slow path, but a
// wide lane may open (tinyOrUnmeasured): a cheap handler would otherwise
// spend its first windows on key lanes. A record leaves the fast paths
// whenever it must be handled alone: it fails, it runs long with records
// waiting behind it (the stuck guard, awake.go), or its partition is
// revoked. The configuration can rule paths out for good (newHandlerCost):
// a batch handler, a rate limit or the adaptive limit count records one by
// one, so they get neither wide lanes nor runs (the adaptive limit still
// allows wide lanes, which it does not see).

// cheapBelow and tinyBelow are the thresholds of the handler-cost model.
const (
	cheapBelow = 20 * time.Microsecond
	tinyBelow  = 5 * time.Microsecond
)

// handlerCost is the model's state. Guarded by engine.mu, but for the
// fields set by newHandlerCost, which are read-only.
type handlerCost struct {
	// perRecord is the last worker's measure of the handler's time per
	// record, 0 until a worker measured it.
	perRecord time.Duration
	// pinned, when not 0, is the measure every worker reports instead of
	// its own, and the measure from the start: for tests whose handler
	// must count as tiny (or slow) whatever -race and a loaded machine make
	// of it, from the first record on.
	pinned time.Duration
	// wideOK: the configuration allows wide lanes (key or unordered mode,
	// a per-record handler, no rate limit: a batch handler batches by lane
	// or from the ready queue, and a rate limit paces the records a worker
	// takes; no outputs produced at least once: each record holds its lane
	// until its outputs are acknowledged, so a partition-wide lane would
	// wait for every produce in turn).
	wideOK bool
	// runOK: the configuration allows record runs: neither a batch
	// handler, nor a rate limit, nor the adaptive limit counting records
	// one by one, nor outputs, which belong to one record each.
	runOK bool
}

func newHandlerCost(c *cfg, batch bool, rate *rates) handlerCost {
	wide := (c.ordering == ByKey || c.ordering == Unordered) && !batch && rate == nil && (!c.outputs || c.exactlyOnce)
	return handlerCost{
		perRecord: c.pinnedCost,
		pinned:    c.pinnedCost,
		wideOK:    wide,
		runOK:     !batch && rate == nil && !c.adaptive && !c.outputs && !c.exactlyOnce,
	}
}

// measured records a worker's estimate of the handler's time per record.
func (h *handlerCost) measured(perRecord time.Duration) {
	if h.pinned > 0 {
		perRecord = h.pinned
	}
	h.perRecord = max(perRecord, 1) // 0 means not measured
}

// cheap reports whether the handler was measured under cheapBelow: the
// awake cap holds.
func (h *handlerCost) cheap() bool { return h.perRecord > 0 && h.perRecord < cheapBelow }

// tiny reports whether the handler was measured under tinyBelow: records
// may enter as runs.
func (h *handlerCost) tiny() bool { return h.perRecord > 0 && h.perRecord < tinyBelow }

// tinyOrUnmeasured reports whether a wide lane may open: the handler was
// measured under tinyBelow, or not measured yet.
func (h *handlerCost) tinyOrUnmeasured() bool { return h.wideOK && h.perRecord < tinyBelow }

// workerFast reports whether a worker whose own estimate is perRecord runs
// its records with a shared attempt context and chains its lane's next
// record (runEach). Read outside the lock: perRecord is the worker's own.
func workerFast(perRecord time.Duration) bool { return perRecord < cheapBelow }
