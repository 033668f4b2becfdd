package kpar

import "github.com/kpar/kpar/internal/cost"

// The handler-cost model lives in internal/cost: from what the handler
// costs per record, it decides which path a record takes (slow, cheap or
// tiny; see the package doc). Workers report their measure to it under
// engine.mu (worker.go); the awake cap (awake.go), admission (admit.go),
// record runs (run.go) and wide lanes (widelane.go, schedule.go) ask it.
// A record leaves the fast paths whenever it must be handled alone: it
// fails, it runs long with records waiting behind it (the stuck guard,
// awake.go), or its partition is revoked.

// newHandlerCost is the model of c's configuration. Wide lanes need key
// or unordered mode, a per-record handler and no rate limit (a batch
// handler batches by lane or from the ready queue, and a rate limit paces
// the records a worker takes) and no outputs produced at least once (each
// record holds its lane until its outputs are acknowledged, so a
// partition-wide lane would wait for every produce in turn); record runs
// need neither a batch handler, nor a rate limit, nor the adaptive limit
// counting records one by one, nor outputs, which belong to one record
// each.
func newHandlerCost(c *cfg, batch, rated bool) cost.Model {
	wide := (c.ordering == ByKey || c.ordering == Unordered) && !batch && !rated && (!c.outputs || c.exactlyOnce)
	runs := !batch && !rated && !c.adaptive && !c.outputs && !c.exactlyOnce
	return cost.New(c.pinnedCost, wide, runs)
}
