package kpar

import (
	"context"
	"time"
)

// The settler goroutine hands the outcomes of finished records back to
// the source (source.settle): a commit for a consumer group,
// acknowledgements for a share group, a progress save for a range. It
// settles as soon as a record finished, at most once per settleEvery, and
// not at all while nothing finishes. A failed settle is retried after a
// backoff that doubles up to 5s, newer outcomes included, so a broker
// that is down is not hammered.

// What finished records leave for the settle is internal/settle's
// Outcomes (e.outcomes); the settle that begins clears its request
// (e.outcomes.Taken, under mu).

// askCommit tells the settler that records finished. Called with mu held;
// costs a bool test per finished record.
func (e *engine) askCommit() {
	if e.outcomes.Ask() {
		select {
		case e.commitWake <- struct{}{}:
		default:
		}
	}
}

func (e *engine) settler(ctx context.Context) {
	var (
		last  time.Time
		fails int
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.commitWake:
		}
		every := e.src.settleEvery() // a group member's follows its share of the group
		spacing := every
		if fails > 0 {
			spacing = min(max(every, time.Millisecond)<<min(fails, 20), 5*time.Second)
		}
		if wait := spacing - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		last = time.Now()
		err := e.src.settle(ctx)
		switch {
		case err == nil:
			fails = 0
		case ctx.Err() != nil:
			return
		default:
			fails++
			if fails&(fails-1) == 0 { // 1, 2, 4, 8...: summarised, not one line per try
				e.log.Warn("kpar: settling finished records failed (commit, acknowledgement or progress save); retrying with backoff, newer progress included",
					"consecutive_failures", fails, "err", err)
			}
			e.mu.Lock()
			e.askCommit() // try again after the backoff
			e.mu.Unlock()
		}
	}
}
