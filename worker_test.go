package kpar

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/window"
)

// TestWorkerChainsNoRecordAfterStop: a worker running a cheap handler's
// lane, which runs each next record of the lane itself instead of queueing
// it, starts no record once the pipeline stopped (as it does when the drain
// times out). It used to run up to 63 more, with a cancelled context.
func TestWorkerChainsNoRecordAfterStop(t *testing.T) {
	var (
		ran atomic.Int64
		e   *engine
	)
	h := HandlerFunc(func(context.Context, *kgo.Record) error {
		if ran.Add(1) == 2 {
			e.mu.Lock()
			e.stop = true
			e.mu.Unlock()
		}
		return nil
	})
	c := defaultCfg()
	c.ordering, c.concurrency = ByPartition, 1
	e = testEngineOf(t, &c, h)
	ps := &partState{tp: tp{topic: "t"}, win: window.New(c.windowRecords), committed: -1, resumeAt: -1}
	e.parts[ps.tp] = ps
	recs := make([]*kgo.Record, 100)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "t", Offset: int64(i)}
	}
	e.mu.Lock()
	e.acceptWithin(ps, recs, e.prepare(recs), len(recs))
	taken := e.take(nil)
	if len(taken) != 1 {
		t.Fatalf("took %d records, want the lane's first", len(taken))
	}
	w := newWorker(e, 0)
	w.perRecord = time.Microsecond // cheap: it chains
	w.runs(taken[0])
	e.mu.Unlock()
	w.runEach(t.Context(), taken[0])
	e.mu.Unlock()
	if n := ran.Load(); n != 2 {
		t.Fatalf("the worker ran %d records; want 2: none after the stop", n)
	}
}
