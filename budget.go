package kpar

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// The group's commit budget. Every member of a consumer group commits to
// one coordinator, the leader of one partition of __consumer_offsets, and
// a member that commits every CommitInterval while records finish sends up
// to 200 requests a second: a group of 16 I/O-bound members sent 2,674 a
// second in kpar bench (BENCHMARKS.md, "Commit traffic"), 50 would send
// about 8,700. CommitBudget bounds what the whole group sends, and each
// member takes the share of it that its partitions are of the group's:
// its least spacing between commits is P / (p × budget), for P partitions
// in the group's topics and p of them assigned to it, and never below
// CommitInterval. The members' shares add up to the budget without any
// member knowing how many others there are, in either group protocol, and
// a member with few partitions commits less often than one with many.
//
// The price is repeated work after a crash: a kill repeats the records in
// flight plus what the member finished since its last commit, about its
// rate times half its spacing. With a 5 ms handler at concurrency 256, a
// kill cost 426 records (1.7 × concurrency) at the 5 ms spacing and 740
// (2.9 ×) at 16 ms, the spacing a 1,000-a-second budget gives each of 16
// members; handlers of 20 ms or more stay within 2 × concurrency up to
// about 40 members. The finished-set metadata keeps the rest: a commit is
// sent whenever the finished set moved, not only the start.

// defaultCommitBudget is CommitBudget's default: about a Java consumer
// group of 5,000 members auto-committing every 5 s.
const defaultCommitBudget = 1000

// CommitBudget bounds the OffsetCommit requests the whole consumer group
// sends its coordinator to perSecond, overriding the default 1,000: each
// member's least spacing between commits grows from CommitInterval to its
// partitions' share of the budget (see the group's commit budget above).
// Groups of up to about five busy members are not slowed by the default.
// 0 turns the budget off: every member commits up to every
// CommitInterval. Not for ShareGroup, which commits no offsets.
func CommitBudget(perSecond float64) ConsumerOpt {
	return consumerOpt(func(c *cfg) { c.commitBudget, c.explicit = perSecond, c.explicit|setCommitBudget })
}

// learnQuota sets the member's spacing from its quota of the group's
// commit budget (the part its partitions are of the group's), after its
// assignment changed. The settler calls it before a commit; the spacing
// applies from the next one.
func (g *groupSource) learnQuota(ctx context.Context) {
	e := g.e
	budget := e.cfg.commitBudget
	e.mu.Lock()
	mine := 0
	topics := map[string]bool{}
	for k, ps := range e.parts {
		if ps.status != dropped {
			mine++
			topics[k.topic] = true
		}
	}
	e.mu.Unlock()
	if budget <= 0 || mine == 0 {
		g.budgetSpacing.Store(0)
		return
	}
	for _, t := range e.retryTo.Consumed() {
		if !e.cfg.regex {
			topics[t] = true
		}
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tds, err := kadm.NewClient(g.cl).ListTopics(ctx, names...)
	if err != nil {
		g.shareStale.Store(true) // the last quota stands until a later settle learns it
		return
	}
	all := 0
	for _, td := range tds {
		if td.Err == nil {
			all += len(td.Partitions)
		}
	}
	all = max(all, mine)
	spacing := time.Duration(float64(all) / (float64(mine) * budget) * float64(time.Second))
	g.budgetSpacing.Store(int64(spacing))
	if spacing > e.cfg.commitInterval {
		e.log.Debug("kpar: commits spaced by the member's quota of the group's commit budget",
			"spacing", spacing, "partitions", mine, "of", all, "budget_per_second", budget)
	}
}
