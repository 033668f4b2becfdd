// Package cost is the handler-cost model: the one place that decides, from
// what the handler costs per record, which path a record takes through
// kpar's pipeline. Every other part asks it; none keeps a threshold of its
// own.
//
// Workers measure the handler's time per record and report it (Measured).
// Two thresholds split the measure into three bands:
//
//   - slow, at or above CheapBelow (20µs): every record is a task of its
//     own, with an attempt context of its own, handed out through the
//     ready queue; every worker may be awake. The handler dominates, and
//     parallelism within a partition is what kpar is for.
//   - cheap, below CheapBelow: a worker runs its records with one shared
//     attempt context and one clock reading, and runs its lane's next
//     record itself instead of queueing it; at most GOMAXPROCS workers are
//     awake (package awake), since more cannot run at once and only queue
//     at the pipeline's lock. In kpar bench noop the awake cap cut 25-40ns
//     of CPU a record (BENCHMARKS.md, eighth pass), and the shared context
//     saves a context and a clock reading a record, which cost more than
//     such a handler.
//   - tiny, below TinyBelow (5µs): on top of that, a key or unordered
//     partition orders its records on one wide lane instead of a lane per
//     key, and records enter a partition's lane in record runs of up to 64
//     under one task. There the per-record bookkeeping, not the handler,
//     is what limits throughput: wide lanes saved 50-70ns a record in key
//     mode (ninth pass), and runs took kpar bench noop from 0.83x to 0.94x
//     the raw franz-go loop (twelfth pass). Above 5µs, a wide lane's lost
//     parallelism within a partition costs more than that: kpar bench cpu
//     (10µs, one partition) measured 1.36-1.72x raw with wide lanes open
//     at 20µs against 1.52-1.65x without them.
//
// Until a worker measured the handler, records take the slow path, but a
// wide lane may open (TinyOrUnmeasured): a cheap handler would otherwise
// spend its first windows on key lanes. The configuration can rule paths
// out for good (New): a batch handler, a rate limit or the adaptive limit
// count records one by one, so they get neither wide lanes nor runs (the
// adaptive limit still allows wide lanes, which it does not see).
//
// Invariants: Tiny implies Cheap; a pinned measure is the only measure;
// once measured, the model never reads as unmeasured again. Model is a
// pure value: no goroutines, no clock, no lock; the caller holds its lock.
package cost

import "time"

// The thresholds of the model.
const (
	CheapBelow = 20 * time.Microsecond
	TinyBelow  = 5 * time.Microsecond
)

// Model is the model's state. Its zero value allows neither wide lanes nor
// runs and is unmeasured.
type Model struct {
	// perRecord is the last worker's measure of the handler's time per
	// record, 0 until a worker measured it.
	perRecord time.Duration
	// pinned, when not 0, is the measure every worker reports instead of
	// its own, and the measure from the start: for tests whose handler
	// must count as tiny (or slow) whatever -race and a loaded machine make
	// of it, from the first record on.
	pinned time.Duration
	wideOK bool
	runOK  bool
}

// New returns the model of a configuration: wideOK when it allows wide
// lanes, runOK when it allows record runs, pinned (0 for none) the
// measure every worker reports instead of its own.
func New(pinned time.Duration, wideOK, runOK bool) Model {
	return Model{perRecord: max(pinned, 0), pinned: max(pinned, 0), wideOK: wideOK, runOK: runOK}
}

// Measured records a worker's estimate of the handler's time per record.
func (m *Model) Measured(perRecord time.Duration) {
	if m.pinned > 0 {
		perRecord = m.pinned
	}
	m.perRecord = max(perRecord, 1) // 0 means not measured
}

// PerRecord is the last measure, 0 until a worker measured one.
func (m *Model) PerRecord() time.Duration { return m.perRecord }

// Cheap reports whether the handler was measured under CheapBelow: the
// awake cap holds.
func (m *Model) Cheap() bool { return m.perRecord > 0 && m.perRecord < CheapBelow }

// Tiny reports whether the handler was measured under TinyBelow.
func (m *Model) Tiny() bool { return m.perRecord > 0 && m.perRecord < TinyBelow }

// WideOK reports whether the configuration allows wide lanes.
func (m *Model) WideOK() bool { return m.wideOK }

// RunsOK reports whether records may enter as runs now: the
// configuration allows them and the handler was measured tiny.
func (m *Model) RunsOK() bool { return m.runOK && m.Tiny() }

// TinyOrUnmeasured reports whether a wide lane may open: the
// configuration allows it, and the handler was measured under TinyBelow,
// or not measured yet.
func (m *Model) TinyOrUnmeasured() bool { return m.wideOK && m.perRecord < TinyBelow }

// WorkerFast reports whether a worker whose own estimate is perRecord runs
// its records with a shared attempt context and chains its lane's next
// record. It takes the worker's own estimate, read outside any lock.
func WorkerFast(perRecord time.Duration) bool { return perRecord < CheapBelow }
