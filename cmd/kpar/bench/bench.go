// Package bench runs kpar side by side with the other ways Go services
// consume Kafka, against one kfake broker (in process, or in a child
// process with Config.SpawnBroker), and reports each
// contender's throughput, latency, memory and — after a simulated crash —
// lost and duplicated records.
//
// Every contender of a run reads the same topic from the same broker in the
// same process, one after the other, so their ratios mean something even on
// a shared, noisy machine where absolute numbers do not. `kpar bench` is the
// command line for Run; the package's Go benchmarks (BenchmarkNoop/raw and
// so on) run the same scenarios under `go test -bench`.
//
// # Measuring
//
// Each run gets a fresh consumer group. The broker holds every fetch until
// the group is stable (all members joined, every partition assigned), then
// the clock starts: what is timed is consumption of the loaded topic, not
// group formation. The clock stops when every record was handled (or when
// the scenario's time cap passes: then the rate counts what was handled).
// Latency is from the moment the consumer's client buffered a record
// (franz-go's HookFetchRecordBuffered) to the end of its handler, sampled
// on about 16,000 records per run; sarama has no such hook, so no latency.
//
// # Crash
//
// The crash scenario arms a kill point once half the records were handled:
// the group's next offset commit reaches the broker and is applied, and at
// that instant the consumer counts as killed — completions after it do not
// count as handled, and the broker refuses every later commit of the group,
// so nothing the dying consumer does afterwards is durable. The consumer is
// then torn down (its handlers return at once) and a new instance of the
// same contender restarts in the same group. Lost records are those never
// handled by either life; duplicates are handlings of a record already
// handled.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Scenario names, in report order.
const (
	Noop     = "noop"
	IO       = "io"
	Keys     = "keys"
	CPU      = "cpu"
	Memory   = "memory"
	PCVolume = "pc-volume"
	Crash    = "crash"
	Adaptive = "adaptive"
	Rate     = "rate"
	Forward  = "forward"
	Decode   = "decode"
	Batch    = "batch"
	// Share is in share.go, Commits in commits.go.
)

// Scenarios lists every scenario name.
func Scenarios() []string {
	return []string{Noop, IO, Keys, CPU, Memory, PCVolume, Crash, Adaptive, Rate, Forward, Decode, Batch, Share, Commits}
}

// Config chooses scenarios and sizes. The zero value of a field means its
// default (see DefaultConfig).
type Config struct {
	Scenarios  []string // default: all
	Contenders []string // default: all; each scenario runs those it uses

	// Records overrides every scenario's record count (not memory's
	// backlogs): noop 1,000,000; io, keys and cpu 50,000; pc-volume
	// 10,000; crash 20,000.
	Records    int
	Partitions int // partitions of noop, io, keys, cpu, memory, crash and the flow scenarios: 8
	// PartitionCounts, when set, are the partition counts that every
	// scenario reading Partitions runs at, one after the other, each
	// result's variant naming its count. Without it the commits scenario
	// runs at 8, 256 and 1,024 partitions, the memory scenario runs its
	// first backlog at those counts too (for RSS per partition), and the
	// others at Partitions.
	PartitionCounts []int
	ValueBytes      int           // value size of noop, io, keys, cpu: 100
	Latency         time.Duration // io and keys handler latency: 5ms
	Concurrency     int           // io and keys concurrency: 256
	CPUWork         time.Duration // cpu handler CPU time per record: 50µs
	Backlogs        []int         // memory backlogs: 10^5, 10^6, 10^7
	// TimeCap stops a run of io, keys or cpu after this long and rates
	// the records it handled (sequential contenders would take minutes):
	// 5s. pc-volume and memory runs always finish.
	TimeCap time.Duration
	// Rounds is how many times noop runs each contender, and forward and
	// batch alternate the generator and kpar, before reporting each
	// one's median: 3. More rounds make one run's median steadier on a
	// shared machine, where a single round's rate moves by a fifth.
	Rounds int

	// The commits scenario's cells: group sizes (1, 4, 16), handlers
	// (HandlerNoop, HandlerIO) and CommitIntervals (0 for the library's
	// default; default: that one only); Steady is each cell's measured
	// window after a warm-up (3s), Kills how many times a member of each
	// io cell is killed and replaced after the window (0: once; negative:
	// never).
	// CommitBudgets are the group's kpar.CommitBudget of each cell:
	// negative for the library's default (default: that one only), 0 for
	// none.
	Members         []int
	Handlers        []string
	CommitIntervals []time.Duration
	CommitBudgets   []float64
	Steady          time.Duration
	Kills           int

	// FetchMaxWait, when set, is passed to every contender's client
	// (kgo.FetchMaxWait; sarama's Consumer.MaxWaitTime) instead of each
	// one's own default: kpar's 500ms, franz-go's 5s, sarama's 500ms.
	FetchMaxWait time.Duration

	// CPUProfile, when set, is a path prefix: each in-process run writes
	// the CPU profile of its measured interval only (no loading, no group
	// formation) to <prefix>-<scenario>-<contender>-<n>.pprof.
	CPUProfile string

	// Spawn, when set, makes the memory scenario run each contender in a
	// child process, so each gets its own peak RSS: Spawn returns a
	// command that runs ServeChild on its stdin and stdout. Without it
	// the memory scenario runs in this process and reports peak heap
	// only.
	Spawn func(ctx context.Context) *exec.Cmd

	// SpawnBroker, when set, runs the broker in a child process: it
	// returns a command that runs ServeBroker on its stdin and stdout.
	// The contenders' process then holds none of the broker's records and
	// allocations (see brokerchild.go). The crash scenario, which stops
	// the broker at a commit, needs the broker in this process and
	// reports an error without it.
	SpawnBroker func() *exec.Cmd

	// Progress receives a line per run; nil discards.
	Progress io.Writer
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Scenarios:   Scenarios(),
		Contenders:  AllContenders(),
		Partitions:  8,
		ValueBytes:  100,
		Latency:     5 * time.Millisecond,
		Concurrency: 256,
		CPUWork:     50 * time.Microsecond,
		Backlogs:    []int{100_000, 1_000_000, 10_000_000},
		TimeCap:     5 * time.Second,
		Rounds:      3,

		Members:         defaultMembers,
		Handlers:        Handlers(),
		CommitIntervals: []time.Duration{0},
		CommitBudgets:   []float64{-1},
		Steady:          3 * time.Second,
		Kills:           1,
	}
}

func (c *Config) fill() {
	d := DefaultConfig()
	if len(c.Scenarios) == 0 {
		c.Scenarios = d.Scenarios
	}
	if len(c.Contenders) == 0 {
		c.Contenders = d.Contenders
	}
	if c.Partitions <= 0 {
		c.Partitions = d.Partitions
	}
	if c.ValueBytes <= 0 {
		c.ValueBytes = d.ValueBytes
	}
	if c.Latency <= 0 {
		c.Latency = d.Latency
	}
	if c.Concurrency <= 0 {
		c.Concurrency = d.Concurrency
	}
	if c.CPUWork <= 0 {
		c.CPUWork = d.CPUWork
	}
	if len(c.Backlogs) == 0 {
		c.Backlogs = d.Backlogs
	}
	if c.TimeCap <= 0 {
		c.TimeCap = d.TimeCap
	}
	if c.Rounds <= 0 {
		c.Rounds = d.Rounds
	}
	if len(c.PartitionCounts) == 1 {
		c.Partitions = c.PartitionCounts[0]
	}
	c.Members, c.Handlers = orDefault(c.Members, d.Members), orDefault(c.Handlers, d.Handlers)
	c.CommitIntervals = orDefault(c.CommitIntervals, d.CommitIntervals)
	c.CommitBudgets = orDefault(c.CommitBudgets, d.CommitBudgets)
	if c.Steady <= 0 {
		c.Steady = d.Steady
	}
	switch {
	case c.Kills == 0:
		c.Kills = d.Kills
	case c.Kills < 0:
		c.Kills = 0
	}
}

// orDefault is s, or def when s is empty.
func orDefault[S ~[]E, E any](s, def S) S {
	if len(s) == 0 {
		return def
	}
	return s
}

// partitionsFor is the partition counts scenario s runs at (see
// PartitionCounts).
func (c *Config) partitionsFor(s string) []int {
	switch {
	case s == PCVolume || s == Share: // one partition, always
		return []int{1}
	case len(c.PartitionCounts) > 0:
		return c.PartitionCounts
	case s == Commits || s == Memory:
		return defaultPartitionCounts
	}
	return []int{c.Partitions}
}

func (c *Config) validate() error {
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios(), s) {
			return fmt.Errorf("unknown scenario %q: want %s", s, strings.Join(Scenarios(), ", "))
		}
	}
	for _, n := range c.Contenders {
		if _, ok := contenderNamed(n); !ok {
			return fmt.Errorf("unknown contender %q: want %s", n, strings.Join(AllContenders(), ", "))
		}
	}
	for _, h := range c.Handlers {
		if !slices.Contains(Handlers(), h) {
			return fmt.Errorf("unknown handler %q: want %s", h, strings.Join(Handlers(), ", "))
		}
	}
	return nil
}

// Result is one contender's run in one scenario (and variant).
type Result struct {
	Scenario  string `json:"scenario"`
	Variant   string `json:"variant,omitempty"`
	Contender string `json:"contender"`
	// Records is how many distinct records were handled in the measured
	// interval; Target how many the topic held.
	Records int64   `json:"records"`
	Target  int64   `json:"target"`
	Seconds float64 `json:"seconds"`
	// Seconds95 is how long the first 95% of the records took: the rate
	// without the run's tail (the last records of a backlog).
	Seconds95     float64 `json:"seconds_95,omitempty"`
	RecordsPerSec float64 `json:"records_per_sec"`
	// Ratio compares with RatioTo: "raw" (noop, cpu: records/s over the
	// raw loop's), "ideal" (io, keys unordered: over the ideal rate),
	// "unordered" (keys, key mode), "published" (pc-volume: wall time
	// over the published one; lower is better), "bound" (pc-volume
	// partition mode: sequential work over wall time), "first backlog"
	// (memory: peak RSS, or heap, over the smallest backlog's).
	Ratio   float64 `json:"ratio,omitempty"`
	RatioTo string  `json:"ratio_to,omitempty"`
	// P50Ms and P99Ms are buffered-to-handled latencies; nil when not
	// measured (sarama, crash).
	P50Ms *float64 `json:"p50_ms"`
	P99Ms *float64 `json:"p99_ms"`
	// PeakRSS is the child process's VmHWM (memory scenario with Spawn);
	// PeakHeap the peak of HeapInuse sampled every 10ms (memory).
	PeakRSS  int64 `json:"peak_rss_bytes,omitempty"`
	PeakHeap int64 `json:"peak_heap_bytes,omitempty"`
	// Cores is process CPU time over wall time during the run, broker
	// included (cpu scenario).
	Cores float64 `json:"cores,omitempty"`
	// MeanSleepMs and SleepOvershootMs: the mean sleep of the handlers
	// (io, keys, pc-volume, crash) and how much longer than asked it was.
	MeanSleepMs      *float64 `json:"mean_sleep_ms,omitempty"`
	SleepOvershootMs *float64 `json:"sleep_overshoot_ms,omitempty"`
	// RSSPerPartition is the memory scenario's slope of peak RSS over
	// the partition count, at the first backlog (least squares over the
	// counts run).
	RSSPerPartition int64 `json:"rss_per_partition_bytes,omitempty"`
	// Commits is a commits-scenario cell's figures.
	Commits    *CommitTraffic `json:"commits,omitempty"`
	Lost       int64          `json:"lost"`
	Duplicates int64          `json:"duplicates"`
	Capped     bool           `json:"capped,omitempty"`
	Note       string         `json:"note,omitempty"`
	Err        string         `json:"error,omitempty"`
}

// Report is a whole Run.
type Report struct {
	Started   time.Time `json:"started"`
	Seconds   float64   `json:"seconds"`
	GoVersion string    `json:"go_version"`
	CPUs      int       `json:"cpus"`
	Config    struct {
		Scenarios  []string `json:"scenarios"`
		Contenders []string `json:"contenders"`
		Records    int      `json:"records,omitempty"`
		Partitions int      `json:"partitions"`
		// PartitionCounts is Config.PartitionCounts when set.
		PartitionCounts []int    `json:"partition_counts,omitempty"`
		Members         []int    `json:"members,omitempty"`
		Handlers        []string `json:"handlers,omitempty"`
		CommitIntervals []string `json:"commit_intervals,omitempty"`
		CommitBudgets   []string `json:"commit_budgets,omitempty"`
		Steady          string   `json:"steady,omitempty"`
		Kills           int      `json:"kills,omitempty"`
		ValueBytes      int      `json:"value_bytes"`
		Latency         string   `json:"latency"`
		Concurrency     int      `json:"concurrency"`
		CPUWork         string   `json:"cpu_work"`
		Backlogs        []int    `json:"backlogs"`
		TimeCap         string   `json:"time_cap"`
		Rounds          int      `json:"rounds"`
		FetchMaxWait    string   `json:"fetch_max_wait,omitempty"`
		ChildRSS        bool     `json:"child_rss"`
	} `json:"config"`
	Results []Result `json:"results"`
}

// Failed reports whether any run failed.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if res.Err != "" {
			return true
		}
	}
	return false
}

// Run starts a broker, loads the topics the chosen scenarios need, runs
// every scenario's contenders one after the other, and returns the report.
// A run that fails is reported with its error and the others go on; Run
// itself fails only when the broker or a topic cannot be set up, or when
// ctx ends.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r, err := newRunner(cfg)
	if err != nil {
		return nil, err
	}
	defer r.close()
	rep := &Report{Started: time.Now(), GoVersion: runtime.Version(), CPUs: runtime.NumCPU()}
	c := &rep.Config
	c.Scenarios, c.Contenders, c.Records = cfg.Scenarios, cfg.Contenders, cfg.Records
	c.Partitions, c.ValueBytes, c.Concurrency = cfg.Partitions, cfg.ValueBytes, cfg.Concurrency
	c.Latency, c.CPUWork, c.TimeCap = cfg.Latency.String(), cfg.CPUWork.String(), cfg.TimeCap.String()
	c.Backlogs, c.ChildRSS, c.Rounds = cfg.Backlogs, cfg.Spawn != nil, cfg.Rounds
	if cfg.FetchMaxWait > 0 {
		c.FetchMaxWait = cfg.FetchMaxWait.String()
	}
	c.PartitionCounts = cfg.PartitionCounts
	if slices.Contains(cfg.Scenarios, Commits) {
		c.Members, c.Handlers, c.Steady, c.Kills = cfg.Members, cfg.Handlers, cfg.Steady.String(), cfg.Kills
		for _, d := range cfg.CommitIntervals {
			c.CommitIntervals = append(c.CommitIntervals, intervalName(d))
		}
		for _, b := range cfg.CommitBudgets {
			c.CommitBudgets = append(c.CommitBudgets, budgetName(b))
		}
	}

	for _, s := range Scenarios() { // report order, whatever the flag's order
		if !slices.Contains(cfg.Scenarios, s) {
			continue
		}
		// Commits and memory run their partition counts themselves,
		// pc-volume and share have one partition; the others run once
		// per count, and say which when it is not the default.
		counts := []int{cfg.Partitions}
		perCount := s != Commits && s != Memory && s != PCVolume && s != Share
		if perCount {
			counts = cfg.partitionsFor(s)
		}
		for _, n := range counts {
			r.cfg.Partitions = n
			res, err := r.scenario(ctx, s)
			if perCount && (len(counts) > 1 || n != DefaultConfig().Partitions) {
				for i := range res {
					res[i].Variant = join(fmt.Sprintf("%s partitions", commas(int64(n))), res[i].Variant)
				}
			}
			rep.Results = append(rep.Results, res...)
			if err != nil {
				return rep, err
			}
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
		r.cfg.Partitions = cfg.Partitions
	}
	rep.Seconds = time.Since(rep.Started).Seconds()
	return rep, nil
}

// runner holds one Run's broker and loaded topics.
type runner struct {
	cfg     Config
	b       *broker
	topics  map[string]*topic
	groups  int
	rawNoop float64 // raw's noop records/s in this run, for io's ideal
}

func newRunner(cfg Config) (*runner, error) {
	b, err := startBroker(cfg.SpawnBroker)
	if err != nil {
		return nil, err
	}
	return &runner{cfg: cfg, b: b, topics: map[string]*topic{}}, nil
}

func (r *runner) close() { r.b.close() }

func (r *runner) progressf(format string, a ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "bench: "+format+"\n", a...)
	}
}

func (r *runner) records(def int) int64 {
	if r.cfg.Records > 0 {
		return int64(r.cfg.Records)
	}
	return int64(def)
}

// topic creates and loads a topic once per Run; a topic of the same name
// and another partition count is named name-<partitions>p.
func (r *runner) topic(ctx context.Context, name string, partitions, keys, valueBytes int, records int64) (*topic, error) {
	if t, ok := r.topics[name]; ok {
		if t.partitions == partitions {
			return t, nil
		}
		name = fmt.Sprintf("%s-%dp", name, partitions)
		if t, ok := r.topics[name]; ok {
			return t, nil
		}
	}
	t, err := r.b.createTopic(ctx, name, partitions, keys, valueBytes)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := r.b.load(ctx, t, records); err != nil {
		return nil, err
	}
	if err := r.b.warm(ctx, t); err != nil {
		return nil, err
	}
	r.progressf("loaded %s: %s records in %s", name, commas(t.total), time.Since(start).Round(time.Millisecond))
	r.topics[name] = t
	return t, nil
}

// dropTopic deletes t from the broker, to free its records, and forgets
// it; a failure only leaves it there.
func (r *runner) dropTopic(t *topic) {
	delete(r.topics, t.name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.b.adm.DeleteTopics(ctx, t.name); err != nil {
		r.progressf("deleting %s: %v", t.name, err)
	}
	if r.b.kc != nil {
		debug.FreeOSMemory() // the broker's records were this process's heap
	}
}

// perPartitionMax bounds the partitions per-partition runs at: it runs a
// group member, a client of its own, per partition, and a thousand of them
// take longer to form a group than the runs last.
const perPartitionMax = 64

func (r *runner) contenders(names ...string) []contender {
	var cs []contender
	for _, n := range names {
		if n == PerPartition && r.cfg.Partitions > perPartitionMax && slices.Contains(r.cfg.Contenders, n) {
			r.progressf("per-partition skipped at %s partitions (one group member each; it runs at %d or fewer)", commas(int64(r.cfg.Partitions)), perPartitionMax)
			continue
		}
		if slices.Contains(r.cfg.Contenders, n) {
			c, _ := contenderNamed(n)
			cs = append(cs, c)
		}
	}
	return cs
}

func (r *runner) group(scenario, contender string) string {
	r.groups++
	return fmt.Sprintf("bench-%s-%s-%d", scenario, contender, r.groups)
}

// runSpec is one gated, timed run.
type runSpec struct {
	scenario, variant string
	c                 contender
	t                 *topic
	work              work
	concurrency       int
	commitEvery       time.Duration
	// cap stops the run and rates what was handled; 0 waits for all.
	cap time.Duration
	// onStart and onStop bracket the timed part (testing.B's timer).
	onStart, onStop func()
}

const (
	settleTimeout = 60 * time.Second // group formation
	runLimit      = 5 * time.Minute  // a run that takes longer failed
	stopTimeout   = 60 * time.Second // shutdown after the measurement
)

func (r *runner) env(s *runSpec, tr *tracker, group string) *env {
	e := &env{
		brokers:     []string{r.b.addr},
		topic:       s.t.name,
		end:         s.t.ends[0],
		group:       group,
		partitions:  s.t.partitions,
		concurrency: s.concurrency,
		commitEvery: s.commitEvery,
		heartbeat:   250 * time.Millisecond,
		kgoOpts: []kgo.Opt{
			kgo.WithHooks(stampHook{tr.mask}),
			// Short heartbeats let multi-member groups settle fast;
			// every franz-go and sarama client gets the same.
			kgo.HeartbeatInterval(250 * time.Millisecond),
		},
	}
	if d := r.cfg.FetchMaxWait; d > 0 {
		e.fetchMaxWait = d
		e.kgoOpts = append(e.kgoOpts, kgo.FetchMaxWait(d))
	}
	w := s.work
	e.handle = func(_ context.Context, rec *kgo.Record) error {
		if tr.skip.Load() {
			return nil
		}
		w(tr, rec)
		tr.handled(rec)
		return nil
	}
	return e
}

// measure runs one contender on s.t until every record is handled (or the
// cap passes) and shuts it down.
func (r *runner) measure(ctx context.Context, s runSpec) Result {
	res := Result{Scenario: s.scenario, Variant: s.variant, Contender: s.c.name, Target: s.t.total}
	tr := newTracker(s.t, true, s.t.total)
	tr.latency = s.c.stamps
	group := r.group(s.scenario, s.c.name)
	e := r.env(&s, tr, group)

	g, err := r.b.closeGate()
	defer g.open()
	if err != nil {
		res.Err = err.Error()
		return res
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- s.c.run(cctx, e) }()
	stop := func() error {
		tr.skip.Store(true)
		cancel()
		g.open()
		select {
		case err := <-errc:
			return err
		case <-time.After(stopTimeout):
			return fmt.Errorf("did not stop within %s", stopTimeout)
		}
	}

	sctx, scancel := context.WithTimeout(ctx, settleTimeout)
	if s.c.settle != nil {
		err = s.c.settle(sctx, g, errc)
	} else {
		err = r.b.waitStable(sctx, group, s.c.members(s.t.partitions), s.t, errc)
	}
	scancel()
	if err != nil {
		res.Err = err.Error()
		_ = stop()
		return res
	}

	runtime.GC() // every run starts from a collected heap
	stopProfile := r.startProfile(s)
	cpu0 := cpuTime()
	if s.onStart != nil {
		s.onStart()
	}
	t0 := time.Now()
	g.open()
	if g.openErr != nil {
		stopProfile()
		res.Err = g.openErr.Error()
		_ = stop()
		return res
	}
	var t95 time.Duration
	n, st, runErr := r.watch(ctx, tr, t0, s.cap, errc, &t95)
	wall := time.Since(t0)
	if s.onStop != nil {
		s.onStop()
	}
	cpu := cpuTime() - cpu0
	stopProfile()
	var stopErr error
	if st != stContenderStopped {
		stopErr = stop()
	} else {
		tr.skip.Store(true)
	}

	res.fill(s, tr, n, wall, cpu, t95, st, runErr, stopErr)
	r.progressf("%s %s: %s records/s%s", strings.TrimSpace(s.scenario+" "+s.variant), s.c.name, commas(int64(res.RecordsPerSec)), errSuffix(res))
	return res
}

// fill records a run's measures in res: n records handled in wall (CPU
// time cpu; t95 to 95 % of them), how the watch ended (st, runErr) and
// the contender's shutdown error.
func (res *Result) fill(s runSpec, tr *tracker, n int64, wall, cpu, t95 time.Duration, st status, runErr, stopErr error) {
	res.Records = n
	res.Seconds = wall.Seconds()
	res.RecordsPerSec = float64(n) / wall.Seconds()
	res.Duplicates = tr.dups.Load()
	res.Cores = cpu.Seconds() / wall.Seconds()
	if t95 > 0 {
		res.Seconds95 = t95.Seconds()
	}
	if over, mean, ok := tr.overshoot(); ok {
		res.SleepOvershootMs, res.MeanSleepMs = ms(over), ms(mean)
	}
	if p50, p99, ok := tr.percentiles(); ok {
		res.P50Ms, res.P99Ms = ms(p50), ms(p99)
	}
	switch st {
	case stCapped:
		res.Capped = true
		res.Note = fmt.Sprintf("capped at %s: %s of %s handled", s.cap, commas(n), commas(s.t.total))
	case stLimit:
		res.Err = fmt.Sprintf("not done after %s: %s of %s handled", runLimit, commas(n), commas(s.t.total))
	case stContenderStopped:
		res.Err = fmt.Sprintf("the contender stopped during the run: %v", runErr)
	case stCancelled:
		res.Err = "cancelled"
	}
	if stopErr != nil && res.Err == "" {
		res.Err = "shutdown: " + stopErr.Error()
	}
}

// startProfile starts the CPU profile of one run when Config.CPUProfile
// asks for it, and returns what stops it.
func (r *runner) startProfile(s runSpec) func() {
	if r.cfg.CPUProfile == "" {
		return func() {}
	}
	name := fmt.Sprintf("%s-%s-%s-%d.pprof", r.cfg.CPUProfile, strings.ReplaceAll(strings.TrimSpace(s.scenario+" "+s.variant), " ", "-"), s.c.name, r.groups)
	f, err := os.Create(name)
	if err != nil {
		r.progressf("cpu profile: %v", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		r.progressf("cpu profile: %v", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

type status int

const (
	stDone status = iota
	stCapped
	stLimit
	stCancelled
	stContenderStopped
)

// watch polls the tracker every millisecond until the target is reached,
// the cap or the run limit passes, ctx ends, or the contender returns.
// When t95 is not nil it receives the time the run took to handle 95% of
// its records.
func (r *runner) watch(ctx context.Context, tr *tracker, t0 time.Time, cap time.Duration, errc <-chan error, t95 *time.Duration) (int64, status, error) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return tr.distinct(), stCancelled, ctx.Err()
		case err := <-errc:
			return tr.distinct(), stContenderStopped, err
		case <-tick.C:
		}
		n := tr.distinct()
		el := time.Since(t0)
		if t95 != nil && *t95 == 0 && n*100 >= tr.target*95 {
			*t95 = el
		}
		switch {
		case n >= tr.target:
			return n, stDone, nil
		case cap > 0 && el >= cap:
			return n, stCapped, nil
		case el >= runLimit:
			return n, stLimit, nil
		}
	}
}

func errSuffix(res Result) string {
	switch {
	case res.Err != "":
		return " (error: " + res.Err + ")"
	case res.Capped:
		return " (" + res.Note + ")"
	}
	return ""
}

func ms(d time.Duration) *float64 {
	v := float64(d) / float64(time.Millisecond)
	return &v
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (r *runner) scenario(ctx context.Context, s string) ([]Result, error) {
	switch s {
	case Noop:
		return r.noop(ctx)
	case IO:
		return r.io(ctx)
	case Keys:
		return r.keys(ctx)
	case CPU:
		return r.cpu(ctx)
	case Memory:
		return r.memory(ctx)
	case PCVolume:
		return r.pcVolume(ctx)
	case Crash:
		return r.crash(ctx)
	case Adaptive:
		return r.adaptive(ctx)
	case Rate:
		return r.rate(ctx)
	case Forward:
		return r.forward(ctx)
	case Decode:
		return r.decode(ctx)
	case Batch:
		return r.batch(ctx)
	case Share:
		return r.share(ctx)
	case Commits:
		return r.commits(ctx)
	}
	return nil, errors.New("unknown scenario " + s)
}
