package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar"
)

// The commits scenario measures what kpar's commits cost a group's
// coordinator, which every member of a group writes to (one
// __consumer_offsets partition). Each cell is a group of Members kpar
// consumers in key mode, in this process, on one topic of Partitions
// partitions loaded with a backlog, with one handler and one
// CommitInterval. The gate opens once the group is stable; after a warm-up
// the window measures, per member, the OffsetCommit requests
// kpar.HookCommitRequest reports (requests, partitions, encoded bytes), and
// at the broker the group's requests and their size on the wire. The
// window ends after Config.Steady, or earlier once three quarters of the
// backlog were handled (noop members drain it fast), so that records are
// left for what follows.
//
// Then, Kills times (with the io handler), one member is killed at a
// random moment: its
// completions stop counting (its handlers in flight then count as in
// flight at the kill), the broker refuses every commit it sends from then
// on, and it is torn down and replaced by a new member, as a supervisor
// restarts a SIGKILLed process. The kill's cost is what the group handles
// again: records the dead member had finished that are handled a second
// time (redone), plus its records in flight at the kill, which a handler
// with side effects (an HTTP endpoint) has seen once already. The cell
// waits until the group has handled every offset below what had been
// handled at the kill and no duplicate came for 300ms.
const Commits = "commits"

// Handlers of the commits scenario (--handler).
const (
	HandlerNoop = "noop" // no work
	HandlerIO   = "io"   // a Config.Latency sleep
)

// Handlers lists the commits scenario's handlers.
func Handlers() []string { return []string{HandlerNoop, HandlerIO} }

// Defaults of the commits scenario.
var (
	defaultPartitionCounts = []int{8, 256, 1024} // commits and memory
	defaultMembers         = []int{1, 4, 16}
)

const (
	// Warm-ups: a noop member is at full speed within 100ms, and the
	// backlog is better spent on the window.
	commitsWarmUp     = time.Second
	commitsNoopWarmUp = 250 * time.Millisecond
	// Each topic's backlog, of commitsValueBytes values: enough for the
	// warm-up, a window of a few seconds and a kill of the fastest group
	// on this machine (a noop member handles 5-7 million records a
	// second; 16 members with a 5ms handler about 450,000 in all).
	commitsNoopRecords = 20_000_000
	commitsIORecords   = 4_000_000
	commitsValueBytes  = 16
	// commitsWindowShare ends the window early once that share of the
	// backlog was handled.
	commitsWindowShare = 0.75
	// killQuiet is how long no duplicate may come before a kill counts as
	// recovered.
	killQuiet      = 300 * time.Millisecond
	recoverTimeout = 60 * time.Second
)

// CommitTraffic is a commits-scenario cell's figures.
type CommitTraffic struct {
	Partitions int    `json:"partitions"`
	Members    int    `json:"members"`
	Handler    string `json:"handler"` // noop, or the io handler's latency
	// CommitInterval is kpar.CommitInterval, "default" for the library's;
	// CommitBudget is kpar.CommitBudget: "default", "off" or "N/s".
	CommitInterval string  `json:"commit_interval"`
	CommitBudget   string  `json:"commit_budget"`
	WindowSeconds  float64 `json:"window_seconds"`
	// Active is how many members committed in the window (a member
	// without partitions sends nothing, nor one whose commits wait).
	Active int `json:"active_members"`
	// Per member: the mean over all Members, and the busiest one.
	MemberCommitsPerSec    float64 `json:"member_commits_per_sec"`
	MaxMemberCommitsPerSec float64 `json:"max_member_commits_per_sec"`
	MemberBytesPerSec      float64 `json:"member_bytes_per_sec"`
	PartitionsPerCommit    float64 `json:"partitions_per_commit"`
	BytesPerCommit         float64 `json:"bytes_per_commit"`
	// The whole group: what its coordinator receives.
	GroupCommitsPerSec float64 `json:"group_commits_per_sec"`
	GroupBytesPerSec   float64 `json:"group_bytes_per_sec"`
	// BrokerCommitsPerSec and WireBytesPerSec are counted at the broker:
	// the requests and their body size at the version sent (the hook's
	// bytes are the request encoded before kgo picks a version).
	BrokerCommitsPerSec float64 `json:"broker_commits_per_sec"`
	WireBytesPerSec     float64 `json:"wire_bytes_per_sec"`
	// CommitRTTMs is the mean OffsetCommit round trip in the window, from
	// writing the request to reading the response, MaxCommitRTTMs the
	// longest: a busy broker in the same process answers commits late.
	CommitRTTMs    float64 `json:"commit_rtt_ms"`
	MaxCommitRTTMs float64 `json:"max_commit_rtt_ms"`
	// Kills and what each cost (means over the kills; see Commits).
	Kills           int     `json:"kills,omitempty"`
	RedonePerKill   float64 `json:"redone_per_kill,omitempty"`
	InFlightPerKill float64 `json:"in_flight_per_kill,omitempty"`
	DupsPerKill     float64 `json:"duplicates_per_kill,omitempty"`
	MaxDupsPerKill  int64   `json:"max_duplicates_per_kill,omitempty"`
}

func (r *runner) commits(ctx context.Context) ([]Result, error) {
	if r.b.kc == nil {
		return []Result{{Scenario: Commits, Contender: KparKey, Err: "the commits scenario watches and refuses commits at the broker, which needs the broker in the bench's process: run it without --broker-process"}}, nil
	}
	var out []Result
	for _, parts := range r.cfg.partitionsFor(Commits) {
		for _, h := range r.cfg.Handlers {
			records := commitsIORecords
			if h == HandlerNoop {
				records = commitsNoopRecords
			}
			t, err := r.topic(ctx, fmt.Sprintf("commits-%s-%dp", h, parts), parts, 100_000, commitsValueBytes, r.records(records))
			if err != nil {
				return out, err
			}
			for _, iv := range r.cfg.CommitIntervals {
				for _, budget := range r.cfg.CommitBudgets {
					for _, m := range r.cfg.Members {
						if ctx.Err() == nil {
							out = append(out, r.commitsCell(ctx, t, m, h, iv, budget))
						}
					}
				}
			}
			// The backlogs are large, and a broker holding ten
			// million records in this process slows every cell
			// after it: one at a time.
			r.dropTopic(t)
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
		}
	}
	return out, nil
}

// intervalName names a CommitInterval, 0 being the library's default.
func intervalName(d time.Duration) string {
	if d == 0 {
		return "default"
	}
	return d.String()
}

// budgetName names a CommitBudget, negative being the library's default.
func budgetName(perSecond float64) string {
	switch {
	case perSecond < 0:
		return "default"
	case perSecond == 0:
		return "off"
	}
	return fmt.Sprintf("%g/s", perSecond)
}

// commitMember is one member of a cell's group.
type commitMember struct {
	cancel  context.CancelFunc
	done    chan struct{} // closed when Run returned
	err     error         // Run's, once done is closed
	leaving atomic.Bool   // stopped on purpose: its end is not a failure

	cl atomic.Pointer[kgo.Client]
	// dead: killed; its handlers no longer count.
	dead              atomic.Bool
	started, finished atomic.Int64
	// What HookCommitRequest reported.
	requests, parts, bytes atomic.Int64
	// OffsetCommit round trips (kgo.HookBrokerE2E): total, count, and
	// the longest since the window opened.
	rttSum, rttN, rttMax atomic.Int64
}

// OnCommitRequest implements kpar.HookCommitRequest. A commit that never
// became a request carries no bytes.
func (m *commitMember) OnCommitRequest(partitions, bytes int, _ error) {
	if bytes > 0 {
		m.requests.Add(1)
		m.parts.Add(int64(partitions))
		m.bytes.Add(int64(bytes))
	}
}

// memberClient captures a member's group client, for its member ID; kpar's
// throwaway validation client has no group.
type memberClient struct{ m *commitMember }

func (h memberClient) OnNewClient(cl *kgo.Client) {
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != "" {
		h.m.cl.Store(cl)
	}
}

// OnBrokerE2E times the member's OffsetCommit round trips, from writing
// the request to reading its response.
func (h memberClient) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if key != int16(kmsg.OffsetCommit) || e2e.Err() != nil {
		return
	}
	d := int64(e2e.DurationE2E())
	h.m.rttSum.Add(d)
	h.m.rttN.Add(1)
	for cur := h.m.rttMax.Load(); d > cur && !h.m.rttMax.CompareAndSwap(cur, d); cur = h.m.rttMax.Load() {
	}
}

var (
	_ kpar.HookCommitRequest = (*commitMember)(nil)
	_ kgo.HookNewClient      = memberClient{}
	_ kgo.HookBrokerE2E      = memberClient{}
)

// commitCell is one cell's group and what it counts.
type commitCell struct {
	r        *runner
	ctx      context.Context
	t        *topic
	tr       *tracker
	e        *env
	work     work
	interval time.Duration
	budget   float64 // negative: the library's default
	members  []*commitMember
	// failed receives the error of a member that stopped on its own.
	failed chan error
}

// start runs a new member in the cell's group.
func (c *commitCell) start() (*commitMember, error) {
	m := &commitMember{done: make(chan struct{})}
	opts := []kpar.ConsumerOpt{
		kpar.Brokers(c.e.brokers...),
		kpar.Group(c.e.group),
		kpar.Topics(c.t.name),
		kpar.Concurrency(c.e.concurrency),
		kpar.Ordering(kpar.ByKey),
		kpar.ClientOptions(append(c.e.kgoOpts, kgo.WithHooks(memberClient{m}))...),
		kpar.WithHooks(m),
	}
	if c.interval > 0 {
		opts = append(opts, kpar.CommitInterval(c.interval))
	}
	if c.budget >= 0 {
		opts = append(opts, kpar.CommitBudget(c.budget))
	}
	tr, w := c.tr, c.work
	cons, err := kpar.New(kpar.HandlerFunc(func(_ context.Context, rec *kgo.Record) error {
		if m.dead.Load() || tr.skip.Load() {
			return nil
		}
		m.started.Add(1)
		w(tr, rec)
		if m.dead.Load() {
			return nil // in flight at the kill
		}
		tr.handled(rec)
		m.finished.Add(1)
		return nil
	}), opts...)
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(c.ctx)
	m.cancel = cancel
	go func() {
		defer close(m.done)
		m.err = cons.Run(mctx)
		if !m.leaving.Load() {
			select {
			case c.failed <- fmt.Errorf("a member stopped: %v", m.err):
			default: // another failure is being reported
			}
		}
	}()
	return m, nil
}

// stop stops m and waits for it.
func (m *commitMember) stop() error {
	m.leaving.Store(true)
	m.cancel()
	select {
	case <-m.done:
		return nil
	case <-time.After(stopTimeout):
		return fmt.Errorf("a member did not stop within %s", stopTimeout)
	}
}

// commitSnap is the cell's counters at one moment.
type commitSnap struct {
	at                     time.Time
	handled                int64
	requests, parts, bytes []int64 // per member
	rttSum, rttN           int64   // all members
	brokerReqs, wireBytes  int64
}

func (c *commitCell) snap(w *commitWatch) commitSnap {
	s := commitSnap{at: time.Now(), handled: c.tr.distinct(), brokerReqs: w.requests.Load(), wireBytes: w.wireBytes.Load()}
	for _, m := range c.members {
		s.requests = append(s.requests, m.requests.Load())
		s.parts = append(s.parts, m.parts.Load())
		s.bytes = append(s.bytes, m.bytes.Load())
		s.rttSum += m.rttSum.Load()
		s.rttN += m.rttN.Load()
	}
	return s
}

// commitsCell runs one cell: members kpar members, handler h, interval iv,
// the group's commit budget.
func (r *runner) commitsCell(ctx context.Context, t *topic, members int, h string, iv time.Duration, budget float64) Result {
	ct := &CommitTraffic{Partitions: t.partitions, Members: members, Handler: h, CommitInterval: intervalName(iv), CommitBudget: budgetName(budget)}
	if h == HandlerIO {
		ct.Handler = r.cfg.Latency.String()
	}
	variant := fmt.Sprintf("%s partitions, %s, %d members, commit interval %s, commit budget %s", commas(int64(t.partitions)), ct.Handler, members, ct.CommitInterval, ct.CommitBudget)
	res := Result{Scenario: Commits, Variant: variant, Contender: KparKey, Target: t.total, Commits: ct}
	c := &commitCell{r: r, ctx: ctx, t: t, tr: newTracker(t, true, t.total), interval: iv, budget: budget, failed: make(chan error, 1+members+r.cfg.Kills)}
	c.work = noWork
	if h == HandlerIO {
		c.work = sleepWork(r.cfg.Latency)
	}
	spec := runSpec{scenario: Commits, t: t, concurrency: r.cfg.Concurrency}
	c.e = r.env(&spec, c.tr, r.group(Commits, KparKey))

	watch := r.b.watchCommits(c.e.group)
	defer watch.stop()
	g, err := r.b.closeGate()
	defer g.open()
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer func() {
		c.tr.skip.Store(true)
		g.open()
		for _, m := range c.members {
			if err := m.stop(); err != nil && res.Err == "" {
				res.Err = "shutdown: " + err.Error()
			}
		}
	}()
	for range members {
		m, err := c.start()
		if err != nil {
			res.Err = err.Error()
			return res
		}
		c.members = append(c.members, m)
	}
	sctx, scancel := context.WithTimeout(ctx, settleTimeout)
	err = r.b.waitStable(sctx, c.e.group, members, t, c.failed)
	scancel()
	if err != nil {
		res.Err = err.Error()
		return res
	}
	g.open()
	if g.openErr != nil {
		res.Err = g.openErr.Error()
		return res
	}
	warmUp := commitsWarmUp
	if h == HandlerNoop {
		warmUp = commitsNoopWarmUp
	}
	if err := c.sleep(warmUp); err != nil {
		res.Err = "warm-up: " + err.Error()
		return res
	}

	if !c.window(watch, &res) {
		return res
	}

	// A noop member's kill costs what it handled in a commit's round
	// trip, which this process's busy broker stretches to seconds: not
	// measured.
	if h != HandlerNoop {
		if err := c.kills(watch, &res); err != nil {
			res.Err = err.Error()
		}
	}
	r.progressf("commits %s: %s records/s, %.0f commits/s per member, %.0f per group, %.1f partitions and %.0f B per commit%s%s",
		variant, commas(int64(res.RecordsPerSec)), ct.MemberCommitsPerSec, ct.GroupCommitsPerSec, ct.PartitionsPerCommit, ct.BytesPerCommit,
		killSuffix(ct), errSuffix(res))
	return res
}

// window measures the cell for --steady (less if the backlog runs low)
// into res, and reports whether it could.
func (c *commitCell) window(watch *commitWatch, res *Result) bool {
	for _, m := range c.members {
		m.rttMax.Store(0)
	}
	s0 := c.snap(watch)
	stopAt := int64(commitsWindowShare * float64(c.t.total))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for time.Since(s0.at) < c.r.cfg.Steady && c.tr.distinct() < stopAt {
		select {
		case <-c.ctx.Done():
			res.Err = "cancelled"
			return false
		case err := <-c.failed:
			res.Err = err.Error()
			return false
		case <-tick.C:
		}
	}
	tick.Stop()
	s1 := c.snap(watch)
	c.figures(res, s0, s1)
	if sec := s1.at.Sub(s0.at); sec < c.r.cfg.Steady*9/10 {
		res.Note = join(res.Note, fmt.Sprintf("the backlog ran low: a %.1fs window", sec.Seconds()))
	}
	return true
}

func killSuffix(ct *CommitTraffic) string {
	if ct.Kills == 0 {
		return ""
	}
	return fmt.Sprintf("; %.0f duplicates per kill (%.0f redone + %.0f in flight) over %d kills", ct.DupsPerKill, ct.RedonePerKill, ct.InFlightPerKill, ct.Kills)
}

// sleep waits d unless a member fails or ctx ends.
func (c *commitCell) sleep(d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case err := <-c.failed:
		return err
	case <-c.ctx.Done():
		return c.ctx.Err()
	}
}

// figures fills res from the window's two snapshots.
func (c *commitCell) figures(res *Result, s0, s1 commitSnap) {
	ct := res.Commits
	sec := s1.at.Sub(s0.at).Seconds()
	ct.WindowSeconds = sec
	res.Seconds = sec
	res.Records = s1.handled - s0.handled
	res.RecordsPerSec = float64(res.Records) / sec
	var reqs, parts, nbytes int64
	for i := range s1.requests {
		dr := s1.requests[i] - s0.requests[i]
		reqs += dr
		parts += s1.parts[i] - s0.parts[i]
		nbytes += s1.bytes[i] - s0.bytes[i]
		if dr > 0 {
			ct.Active++
		}
		ct.MaxMemberCommitsPerSec = max(ct.MaxMemberCommitsPerSec, float64(dr)/sec)
	}
	ct.GroupCommitsPerSec = float64(reqs) / sec
	ct.GroupBytesPerSec = float64(nbytes) / sec
	ct.MemberCommitsPerSec = ct.GroupCommitsPerSec / float64(ct.Members)
	ct.MemberBytesPerSec = ct.GroupBytesPerSec / float64(ct.Members)
	if reqs > 0 {
		ct.PartitionsPerCommit = float64(parts) / float64(reqs)
		ct.BytesPerCommit = float64(nbytes) / float64(reqs)
	}
	if n := s1.rttN - s0.rttN; n > 0 {
		ct.CommitRTTMs = float64(s1.rttSum-s0.rttSum) / float64(n) / float64(time.Millisecond)
	}
	for _, m := range c.members {
		ct.MaxCommitRTTMs = max(ct.MaxCommitRTTMs, float64(m.rttMax.Load())/float64(time.Millisecond))
	}
	ct.BrokerCommitsPerSec = float64(s1.brokerReqs-s0.brokerReqs) / sec
	ct.WireBytesPerSec = float64(s1.wireBytes-s0.wireBytes) / sec
	if ct.Active < ct.Members {
		res.Note = join(res.Note, fmt.Sprintf("%d of %d members committed in the window", ct.Active, ct.Members))
	}
}

// kills kills a member Config.Kills times, each at a random moment,
// replaces it, and measures what the group handles again (see Commits).
func (c *commitCell) kills(watch *commitWatch, res *Result) error {
	ct := res.Commits
	var redone, inFlight, worst int64
	for k := range c.r.cfg.Kills {
		if left := c.t.total - c.tr.distinct(); left < c.t.total/10 {
			res.Note = join(res.Note, fmt.Sprintf("the backlog ran out after %d kills", k))
			break
		}
		if k > 0 {
			// The replacement rejoined: let the group settle again.
			sctx, cancel := context.WithTimeout(c.ctx, settleTimeout)
			err := c.r.b.waitStable(sctx, c.e.group, len(c.members), c.t, c.failed)
			cancel()
			if err != nil {
				return fmt.Errorf("kill %d: %w", k+1, err)
			}
			if err := c.sleep(500 * time.Millisecond); err != nil {
				return err
			}
		}
		if err := c.sleep(time.Duration(rand.Int64N(int64(20 * time.Millisecond)))); err != nil {
			return err
		}
		i, err := c.pickVictim(k)
		if err != nil {
			return err
		}
		victim := c.members[i]
		cl := victim.cl.Load()
		if cl == nil {
			return errors.New("a member's client was not captured")
		}
		id, _ := cl.GroupMetadata()
		// The kill: nothing the victim finishes or commits from now on
		// counts.
		victim.dead.Store(true)
		watch.kill(id)
		hi := c.tr.highest()
		dups0 := c.tr.dups.Load()
		if err := victim.stop(); err != nil {
			return err
		}
		flying := victim.started.Load() - victim.finished.Load()
		repl, err := c.start()
		if err != nil {
			return err
		}
		c.members[i] = repl

		last, quietSince := c.tr.dups.Load(), time.Now()
		deadline := time.Now().Add(recoverTimeout)
		for {
			if err := c.sleep(5 * time.Millisecond); err != nil {
				return err
			}
			if d := c.tr.dups.Load(); d != last {
				last, quietSince = d, time.Now()
			}
			if c.tr.handledThrough(hi) && time.Since(quietSince) >= killQuiet {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kill %d: the group did not handle again what it had handled at the kill within %s", k+1, recoverTimeout)
			}
		}
		d := c.tr.dups.Load() - dups0
		redone += d
		inFlight += flying
		worst = max(worst, d+flying)
		ct.Kills++
	}
	if ct.Kills > 0 {
		n := float64(ct.Kills)
		ct.RedonePerKill, ct.InFlightPerKill = float64(redone)/n, float64(inFlight)/n
		ct.DupsPerKill = ct.RedonePerKill + ct.InFlightPerKill
		ct.MaxDupsPerKill = worst
		res.Duplicates = redone + inFlight
	}
	return nil
}

// pickVictim returns the index of the member the k-th kill kills: one of
// those that handled records in the last 100ms (a member without
// partitions has nothing to lose), in turn.
func (c *commitCell) pickVictim(k int) (int, error) {
	before := make([]int64, len(c.members))
	for i, m := range c.members {
		before[i] = m.finished.Load()
	}
	if err := c.sleep(100 * time.Millisecond); err != nil {
		return 0, err
	}
	var busy []int
	for i, m := range c.members {
		if m.finished.Load() > before[i] {
			busy = append(busy, i)
		}
	}
	if len(busy) == 0 {
		return 0, errors.New("no member handled a record in 100ms: nothing to kill")
	}
	return busy[k%len(busy)], nil
}

// commitsTable writes the commits scenario's results as their own table.
func commitsTable(b *strings.Builder, rs []Result) {
	b.WriteString("| partitions | handler | members | commit interval, group budget | records/s | commits/s per member (busiest) | commits/s per group | OffsetCommit B/s per member | partitions per commit | B per commit | commit round trip, mean (max) | duplicates per kill (redone + in flight) | note |\n")
	b.WriteString("|--:|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, res := range rs {
		ct := res.Commits
		if ct == nil {
			fmt.Fprintf(b, "| - | - | - | - | - | - | - | - | - | - | - | - | **error**: %s |\n", res.Err)
			continue
		}
		kill := "-"
		if ct.Kills > 0 {
			kill = fmt.Sprintf("%s (%s + %s; max %s, %d kills)", commas(int64(ct.DupsPerKill)), commas(int64(ct.RedonePerKill)),
				commas(int64(ct.InFlightPerKill)), commas(ct.MaxDupsPerKill), ct.Kills)
		}
		note := res.Note
		if res.Err != "" {
			note = join("**error**: "+res.Err, note)
		}
		fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %.0f (%.0f) | %s | %s | %.1f | %.0f | %.1f ms (%.0f) | %s | %s |\n",
			commas(int64(ct.Partitions)), ct.Handler, ct.Members, ct.CommitInterval+", budget "+ct.CommitBudget, commas(int64(res.RecordsPerSec)),
			ct.MemberCommitsPerSec, ct.MaxMemberCommitsPerSec, commas(int64(ct.GroupCommitsPerSec)), commas(int64(ct.MemberBytesPerSec)),
			ct.PartitionsPerCommit, ct.BytesPerCommit, ct.CommitRTTMs, ct.MaxCommitRTTMs, kill, strings.ReplaceAll(note, "|", "\\|"))
	}
}
