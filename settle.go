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
// that is down is not hammered; partitions assigned to the member drop
// the backoff (settleAfresh), since the group answers again.

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

// settleAfresh drops the backoff of failed settles: the group answered
// again (the member got partitions), and the backoff, doubled through an
// outage up to 5s, would only hold back the first commit of the new
// assignment. A member the restarted broker forgot again meanwhile lost
// that work's commit (issue 35: commits resumed 2s after the rejoin, and
// the broker was killed again before). Any goroutine, no lock needed.
func (e *engine) settleAfresh() {
	select {
	case e.settleReset <- struct{}{}:
	default:
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
		case <-e.settleReset:
			fails = 0
			continue
		case <-e.commitWake:
		}
		if !e.waitSpacing(ctx, last, &fails) {
			return
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

// waitSpacing waits out the spacing since the last settle: settleEvery,
// or after fails failed settles a backoff that doubles up to 5s, cut back
// to settleEvery by settleAfresh. It returns false when ctx ended.
func (e *engine) waitSpacing(ctx context.Context, last time.Time, fails *int) bool {
	for {
		every := e.src.settleEvery() // a group member's follows its share of the group
		spacing := every
		if *fails > 0 {
			spacing = min(max(every, time.Millisecond)<<min(*fails, 20), 5*time.Second)
		}
		wait := spacing - time.Since(last)
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
			return true
		case <-e.settleReset:
			t.Stop()
			*fails = 0
		}
	}
}
