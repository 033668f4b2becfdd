package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kpar/kpar"
)

// Default concurrency of noop, cpu and crash: kpar's own default.
const defaultConcurrency = 64

// ---- noop ----

func (r *runner) noop(ctx context.Context) ([]Result, error) {
	t, err := r.topic(ctx, "noop", r.cfg.Partitions, 100_000, r.cfg.ValueBytes, r.records(1_000_000))
	if err != nil {
		return nil, err
	}
	// Runs this short are noisy on a shared machine: each contender runs
	// Rounds times, round-robin so drift hits everyone alike, and reports
	// its median.
	cs := r.contenders(Contenders()...)
	runs := make([][]Result, len(cs))
	for range r.cfg.Rounds {
		for i, c := range cs {
			runs[i] = append(runs[i], r.measure(ctx, runSpec{scenario: Noop, c: c, t: t, work: noWork, concurrency: defaultConcurrency}))
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
	}
	var out []Result
	for _, rs := range runs {
		out = append(out, median(rs))
	}
	raw := find(out, Raw, "")
	if raw != nil && raw.Err == "" {
		r.rawNoop = raw.RecordsPerSec
	}
	for i := range out {
		res := &out[i]
		if raw != nil && raw.Err == "" {
			res.Ratio, res.RatioTo = res.RecordsPerSec/raw.RecordsPerSec, "raw"
		}
		if res.Seconds95 > 0 {
			note := fmt.Sprintf("first 95%%: %s/s", commas(int64(0.95*float64(res.Target)/res.Seconds95)))
			if raw != nil && raw.Seconds95 > 0 {
				note += fmt.Sprintf(" (%.2f× raw's)", raw.Seconds95/res.Seconds95)
			}
			res.Note = join(res.Note, note)
		}
	}
	return out, ctx.Err()
}

// median returns the run with the median rate, noting the spread; a failed
// run wins, so that its error shows.
func median(rs []Result) Result {
	for _, r := range rs {
		if r.Err != "" {
			return r
		}
	}
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b Result) int { return cmp.Compare(a.RecordsPerSec, b.RecordsPerSec) })
	m := sorted[len(sorted)/2]
	if len(rs) > 1 {
		m.Note = join(m.Note, fmt.Sprintf("median of %d: %s–%s/s", len(rs),
			commas(int64(sorted[0].RecordsPerSec)), commas(int64(sorted[len(sorted)-1].RecordsPerSec))))
		slices.SortFunc(sorted, func(a, b Result) int { return cmp.Compare(a.Seconds95, b.Seconds95) })
		m.Seconds95 = sorted[len(sorted)/2].Seconds95
	}
	return m
}

func find(rs []Result, contender, variant string) *Result {
	for i := range rs {
		if rs[i].Contender == contender && rs[i].Variant == variant {
			return &rs[i]
		}
	}
	return nil
}

// ---- io ----

// ioTopic is shared by io, keys (100,000 keys) and cpu.
func (r *runner) keyedTopic(ctx context.Context, keys int) (*topic, error) {
	return r.topic(ctx, fmt.Sprintf("keys-%d", keys), r.cfg.Partitions, keys, r.cfg.ValueBytes, r.records(50_000))
}

// ideal is the ideal rate of an io or keys run: concurrency over the
// handler latency the run really had (its mean sleep: sleeps overshoot on
// this machine), or raw's noop rate when that is lower.
func (r *runner) ideal(res *Result) (float64, string) {
	lat := r.cfg.Latency
	if res.MeanSleepMs != nil {
		lat = time.Duration(*res.MeanSleepMs * float64(time.Millisecond))
	}
	ideal := float64(r.cfg.Concurrency) / lat.Seconds()
	how := fmt.Sprintf("%d / %.2fms measured sleep", r.cfg.Concurrency, float64(lat)/float64(time.Millisecond))
	if r.rawNoop > 0 && r.rawNoop < ideal {
		ideal, how = r.rawNoop, "raw noop rate"
	}
	return ideal, how
}

func (r *runner) io(ctx context.Context) ([]Result, error) {
	t, err := r.keyedTopic(ctx, 100_000)
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, c := range r.contenders(PerPartition, NaivePool, KparKey, KparPartition, KparUnordered, Sarama) {
		out = append(out, r.measure(ctx, runSpec{scenario: IO, c: c, t: t, work: sleepWork(r.cfg.Latency),
			concurrency: r.cfg.Concurrency, cap: r.cfg.TimeCap}))
	}
	pp := find(out, PerPartition, "")
	for i := range out {
		res := &out[i]
		ideal, how := r.ideal(res)
		res.Ratio, res.RatioTo = res.RecordsPerSec/ideal, "ideal"
		note := fmt.Sprintf("ideal %s/s (%s)", commas(int64(ideal)), how)
		if pp != nil && pp.RecordsPerSec > 0 && res.Contender != PerPartition {
			note += fmt.Sprintf("; %.1fx per-partition", res.RecordsPerSec/pp.RecordsPerSec)
		}
		res.Note = join(res.Note, note)
	}
	return out, ctx.Err()
}

func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// ---- keys ----

func (r *runner) keys(ctx context.Context) ([]Result, error) {
	var out []Result
	for _, k := range []int{10, 1_000, 100_000} {
		t, err := r.keyedTopic(ctx, k)
		if err != nil {
			return out, err
		}
		variant := fmt.Sprintf("%s keys", commas(int64(k)))
		var rs []Result
		for _, c := range r.contenders(KparKey, KparUnordered) {
			rs = append(rs, r.measure(ctx, runSpec{scenario: Keys, variant: variant, c: c, t: t,
				work: sleepWork(r.cfg.Latency), concurrency: r.cfg.Concurrency, cap: r.cfg.TimeCap}))
		}
		un := find(rs, KparUnordered, variant)
		for i := range rs {
			res := &rs[i]
			if res.Contender == KparKey && un != nil && un.RecordsPerSec > 0 {
				res.Ratio, res.RatioTo = res.RecordsPerSec/un.RecordsPerSec, "unordered"
			} else {
				ideal, how := r.ideal(res)
				res.Ratio, res.RatioTo = res.RecordsPerSec/ideal, "ideal"
				res.Note = join(res.Note, fmt.Sprintf("ideal %s/s (%s)", commas(int64(ideal)), how))
			}
		}
		out = append(out, rs...)
		if ctx.Err() != nil {
			break
		}
	}
	return out, ctx.Err()
}

// ---- cpu ----

func (r *runner) cpu(ctx context.Context) ([]Result, error) {
	t, err := r.keyedTopic(ctx, 100_000)
	if err != nil {
		return nil, err
	}
	iters := calibrateBurn(r.cfg.CPUWork)
	r.progressf("cpu: %d xorshift rounds per record take about %s", iters, r.cfg.CPUWork)
	var out []Result
	for _, c := range r.contenders(Contenders()...) {
		out = append(out, r.measure(ctx, runSpec{scenario: CPU, c: c, t: t, work: burnWork(iters),
			concurrency: defaultConcurrency, cap: r.cfg.TimeCap}))
	}
	raw := find(out, Raw, "")
	for i := range out {
		res := &out[i]
		if raw != nil && raw.RecordsPerSec > 0 {
			res.Ratio, res.RatioTo = res.RecordsPerSec/raw.RecordsPerSec, "raw"
		}
		res.Note = join(res.Note, fmt.Sprintf("%.2f cores busy (broker included)", res.Cores))
	}
	return out, ctx.Err()
}

// ---- pc-volume ----

// Published wall times of the best-known Java parallel consumer's volume
// test (10,000 records, 1 partition, random 0-5 ms of work, concurrency
// 100), on other hardware.
var pcPublished = map[string]float64{
	"partition": 22.2,
	"key 1":     26.7,
	"key 2":     13.6,
	"key 10":    3.3,
	"key 100":   2.18,
	"key 1000":  2.06,
	"unordered": 2.83,
}

const (
	pcConcurrency = 100
	pcMaxMicros   = 5000
)

func (r *runner) pcVolume(ctx context.Context) ([]Result, error) {
	type variant struct {
		name string
		c    string
		keys int
	}
	vs := []variant{
		{"partition", KparPartition, 1000},
		{"unordered", KparUnordered, 1000},
		{"key 1", KparKey, 1},
		{"key 2", KparKey, 2},
		{"key 10", KparKey, 10},
		{"key 100", KparKey, 100},
		{"key 1000", KparKey, 1000},
	}
	var out []Result
	for _, v := range vs {
		cs := r.contenders(v.c)
		if len(cs) == 0 {
			continue
		}
		t, err := r.topic(ctx, fmt.Sprintf("pc-volume-%d", v.keys), 1, v.keys, r.cfg.ValueBytes, r.records(10_000))
		if err != nil {
			return out, err
		}
		res := r.measure(ctx, runSpec{scenario: PCVolume, variant: v.name, c: cs[0], t: t,
			work: randomSleep(pcMaxMicros), concurrency: pcConcurrency})
		// Bounds from the sleeps as asked, and as this machine's
		// sleeps really take (each overshoots by the run's mean).
		seq, busiest, busiestN := pcBounds(t)
		var over float64
		if res.SleepOvershootMs != nil {
			over = *res.SleepOvershootMs / 1000
		}
		realSeq := seq + over*float64(t.total)
		ideal := max(realSeq/pcConcurrency, busiest+over*float64(busiestN))
		wall := res.Seconds
		if v.c == KparPartition {
			res.Ratio, res.RatioTo = realSeq/wall, "bound"
			res.Note = fmt.Sprintf("wall %.2fs; sequential bound %.2fs (%.2fs as asked, sleeps +%.2fms each); published %.1fs",
				wall, realSeq, seq, over*1000, pcPublished[v.name])
		} else {
			res.Ratio, res.RatioTo = wall/pcPublished[v.name], "published"
			res.Note = fmt.Sprintf("wall %.2fs; published %.2fs; ideal %.2fs", wall, pcPublished[v.name], ideal)
		}
		out = append(out, res)
		if ctx.Err() != nil {
			break
		}
	}
	return out, ctx.Err()
}

// pcBounds returns the total work of a one-partition pc-volume topic in
// seconds, and the work and record count of its busiest key (what key mode
// cannot beat), all as asked of time.Sleep.
func pcBounds(t *topic) (seq, busiest float64, busiestN int64) {
	type key struct {
		d time.Duration
		n int64
	}
	perKey := map[int64]*key{}
	var total time.Duration
	for off := range t.ends[0] {
		d := randomDelay(0, off, pcMaxMicros)
		total += d
		if t.keys > 0 {
			k := perKey[off%int64(t.keys)] // one partition: offset == record index
			if k == nil {
				k = &key{}
				perKey[off%int64(t.keys)] = k
			}
			k.d += d
			k.n++
		}
	}
	var b key
	for _, k := range perKey {
		if k.d > b.d {
			b = *k
		}
	}
	return total.Seconds(), b.d.Seconds(), b.n
}

// ---- crash ----

const (
	crashMaxMicros = 2000
	// crashCommitEvery is kpar's CommitInterval and naive-pool's commit
	// period in the crash scenario: short, so the kill point (the first
	// commit after half the records) lands while records are in flight.
	crashCommitEvery = 20 * time.Millisecond
)

func (r *runner) crash(ctx context.Context) ([]Result, error) {
	t, err := r.topic(ctx, "crash", r.cfg.Partitions, 1000, r.cfg.ValueBytes, r.records(20_000))
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, c := range r.contenders(NaivePool, PerPartition, KparKey, KparPartition, KparUnordered) {
		out = append(out, r.crashRun(ctx, c, t))
		if ctx.Err() != nil {
			break
		}
	}
	return out, ctx.Err()
}

// crashRun runs c until half the records are handled, kills it at its next
// commit (see the package documentation), restarts it in the same group
// and lets it finish.
func (r *runner) crashRun(ctx context.Context, c contender, t *topic) Result {
	res := Result{Scenario: Crash, Contender: c.name, Target: t.total}
	tr := newTracker(t, true, t.total)
	group := r.group(Crash, c.name)
	spec := runSpec{scenario: Crash, c: c, t: t, work: randomSleep(crashMaxMicros),
		concurrency: defaultConcurrency, commitEvery: crashCommitEvery}
	if r.b.kc == nil {
		res.Err = "the crash scenario stops the broker at a commit, which needs the broker in the bench's process: run it without --broker-process"
		return res
	}
	e := r.env(&spec, tr, group)
	cp := r.b.crashAtCommit(group, func() { tr.frozen.Store(true) })
	defer cp.restart() // let the control go even on failure

	l := crashLife{c: c, e: e, tr: tr, t: t, cp: cp}
	life := func(until func() bool, limit time.Duration) error { return l.live(ctx, until, limit) }

	// Life 1: arm the kill point at half, die at the next commit.
	half := t.total / 2
	err := life(func() bool {
		if !cp.armed.Load() && tr.distinct() >= half {
			cp.armed.Store(true)
		}
		select {
		case <-cp.killed:
			return true
		default:
			return tr.distinct() >= t.total // finished before any commit came
		}
	}, runLimit)
	atKill := tr.distinct()
	if err != nil {
		res.Err = "first life: " + err.Error()
		return res
	}
	select {
	case <-cp.killed:
	default:
		res.Err = "the consumer finished every record before it committed: no crash point"
		return res
	}
	committedAtKill, _, _ := r.b.committed(ctx, group, t)

	// Life 2: the restart, until every record is handled or the group has
	// committed the end of every partition and nothing happens for 500ms.
	cp.restart()
	tr.frozen.Store(false)
	var (
		last      = tr.distinct() + tr.dups.Load()
		lastMove  = time.Now()
		lastCheck time.Time
		atEnd     bool
	)
	err = life(func() bool {
		n := tr.distinct()
		if n >= t.total {
			return true
		}
		if cur := n + tr.dups.Load(); cur != last {
			last, lastMove = cur, time.Now()
		}
		if time.Since(lastCheck) > 100*time.Millisecond {
			lastCheck = time.Now()
			_, atEnd, _ = r.b.committed(ctx, group, t)
		}
		return atEnd && time.Since(lastMove) > 500*time.Millisecond
	}, runLimit)
	if err != nil {
		res.Err = "restart: " + err.Error()
	}
	n := tr.distinct()
	res.Records = n
	res.Lost = t.total - n
	res.Duplicates = tr.dups.Load()
	res.Note = fmt.Sprintf("killed with %s handled, %s committed", commas(atKill), commas(committedAtKill))
	r.progressf("crash %s: lost %d, duplicates %d%s", c.name, res.Lost, res.Duplicates, errSuffix(res))
	return res
}

// crashLife is what each life of a crash run shares: the contender, its
// environment and tracker, the topic and the crash point.
type crashLife struct {
	c  contender
	e  *env
	tr *tracker
	t  *topic
	cp *crashPoint
}

// live runs the contender until until says so (polled every 5ms), ctx is
// done or limit passed, then stops it, and returns why it did not finish.
func (l crashLife) live(ctx context.Context, until func() bool, limit time.Duration) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- l.c.run(lctx, l.e) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(limit)
	var runErr error
wait:
	for !until() {
		select {
		case <-ctx.Done():
			runErr = ctx.Err()
			break wait
		case err := <-errc:
			return fmt.Errorf("the contender stopped: %v", err)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			runErr = fmt.Errorf("not done after %s: %s of %s handled", limit, commas(l.tr.distinct()), commas(l.t.total))
			break
		}
	}
	l.tr.skip.Store(true)
	cancel()
	select {
	case err := <-errc:
		if l.cp.state.Load() == 1 && errors.Is(err, kpar.ErrFinalCommit) {
			err = nil // the broker refuses the dead life's commits: its last one too
		}
		runErr = join2(runErr, err)
	case <-time.After(stopTimeout):
		runErr = join2(runErr, fmt.Errorf("did not stop within %s", stopTimeout))
	}
	l.tr.skip.Store(false)
	return runErr
}

func join2(a, b error) error {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	return fmt.Errorf("%v; %v", a, b)
}
