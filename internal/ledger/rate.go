package ledger

import (
	"slices"
	"time"
)

// MaxInWindow returns the most times within any window of d: the rate a run
// kept at its peak, which a rate limit of n a window (plus its burst) must
// bound. ts is left as it is.
func MaxInWindow(ts []time.Time, d time.Duration) int {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= d {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}
