package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kpar/kpar/cmd/kpar/bench"
)

// benchChildFlag is the hidden first argument that makes `kpar bench` the
// child process of the memory scenario: it reads one run from stdin and
// writes its result, with its own peak RSS, to stdout.
const benchChildFlag = "--child"

// benchBrokerChildFlag is the hidden first argument that makes `kpar
// bench` the broker of --broker-process: it runs a broker and follows the
// gate commands of its parent on stdin (bench.ServeBroker).
const benchBrokerChildFlag = "--broker-child"

// selfExecutable is this binary's path, for the bench's child processes.
func selfExecutable() string {
	if exe, err := os.Executable(); err == nil {
		return exe
	}
	return os.Args[0]
}

// cmdBench runs the side-by-side benchmarks of package bench and prints a
// Markdown table (or, with --json, the whole report) to stdout. Progress
// goes to stderr. It exits 0 when every run worked, 1 when one failed (the
// table still shows the others) and 2 for bad usage.
func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code, ok := benchChild(ctx, args, stdout, stderr); ok {
		return code
	}
	b, code, ok := parseBench(args, stderr)
	if !ok {
		return code
	}
	cfg, code, ok := b.config(stderr)
	if !ok {
		return code
	}
	rep, err := bench.Run(ctx, cfg)
	if rep != nil {
		if *b.jsonOut {
			_ = rep.WriteJSON(stdout)
		} else {
			_ = rep.WriteMarkdown(stdout)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "kpar bench: %v\n", err)
		return 1
	}
	if rep.Failed() {
		fmt.Fprintln(stderr, "kpar bench: some runs failed; see the error notes in the table")
		return 1
	}
	return 0
}

// benchChild runs a child process of the bench (a contender, or the
// broker of --broker-process) when args ask for one, and reports whether
// they did.
func benchChild(ctx context.Context, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	serve := map[string]func(context.Context, io.Reader, io.Writer) error{
		benchChildFlag:       bench.ServeChild,
		benchBrokerChildFlag: bench.ServeBroker,
	}
	if len(args) == 0 || serve[args[0]] == nil {
		return 0, false
	}
	if err := serve[args[0]](ctx, os.Stdin, stdout); err != nil {
		fmt.Fprintf(stderr, "kpar bench: %v\n", err)
		return 1, true
	}
	return 0, true
}

// benchUsage is kpar bench's synopsis and description.
const benchUsage = `

Runs each contender against one kfake broker loaded with the same topics (in
this process, or with --broker-process in a child process), one after the
other, and prints a Markdown table: records/s, a ratio
(to the raw loop, to the ideal rate, to key-less ordering, to published
numbers or to the smallest backlog, as the column says), buffered-to-handled
latency p50/p99, peak RSS and heap (memory scenario), and lost and duplicated
records (crash scenario). Compare ratios from one run; absolute rates on a
shared machine mean little.

Contenders: raw (one franz-go poll loop), per-partition (one group member per
partition, kpar.RunMembers), naive-pool (one poller, a worker pool, commits the
highest finished offset), batch-pool (naive-pool handing workers runs of 256
records instead of one; noop only), kpar-key, kpar-partition, kpar-unordered,
and sarama in a binary built with -tags sarama (go build -tags sarama
./cmd/kpar); and,
in the share scenario only, kpar-share (kpar.ShareGroup), raw-share (a plain
franz-go share consumer) and backfill-1/2/4 (kpar.Backfill with 1, 2 or 4
readers).

Scenarios: noop (no work), io (--latency sleep at --concurrency), keys (io in
key mode with 10, 1,000 and 100,000 keys vs unordered), cpu (--cpu-work of CPU
per record), memory (peak RSS over --backlogs, each run in a child process),
pc-volume (the Java parallel consumer's volume test: 10,000 records, one
partition, 0-5 ms random work, concurrency 100), crash (kill at a commit
mid-run, restart: lost and duplicated records), share (one partition, noop
and --latency handlers: kpar-unordered, backfill-1/2/4, kpar-share and
raw-share, each capped at --time-cap), commits (what kpar's commits cost the
group's coordinator: groups of --members kpar members in key mode, per
--handler, --commit-interval and --commit-budget, at 8, 256 and 1,024 partitions; commits/s,
OffsetCommit bytes/s and partitions per commit per member, commits/s per
group, and the duplicates of --kills kills of a member; its own table),
decode (~200-byte Avro and Protobuf records in the Confluent wire format
forwarded to a no-op endpoint decoded to JSON through a registry, against
the raw bytes in the same run; ratio and CPU per record).

--partitions takes a list: each scenario runs at every count in it (commits
and memory default to 8,256,1024: memory runs its first backlog at each and
reports RSS per partition; the others to 8).`

// benchFlags are kpar bench's flags.
type benchFlags struct {
	fs              *flagSet
	scenarios       *string
	contenders      *string
	records         *int
	partitions      *string
	members         *string
	handlers        *string
	commitIntervals *string
	commitBudgets   *string
	steady          *time.Duration
	kills           *int
	valueBytes      *int
	latency         *time.Duration
	concurrency     *int
	cpuWork         *time.Duration
	backlogs        *string
	timeCap         *time.Duration
	fetchMaxWait    *time.Duration
	rounds          *int
	cpuProfile      *string
	jsonOut         *bool
	brokerProcess   *bool
}

// parseBench defines kpar bench's flags and parses args.
func parseBench(args []string, stderr io.Writer) (*benchFlags, int, bool) {
	fs := newFlagSet("bench", benchUsage, stderr)
	b := &benchFlags{fs: fs}
	b.scenarios = fs.String("scenario", "all", "comma-separated `scenarios` to run: "+strings.Join(bench.Scenarios(), ", ")+", or all")
	b.contenders = fs.String("contenders", "all", "comma-separated `contenders` to run: "+strings.Join(bench.AllContenders(), ", ")+", or all")
	b.records = fs.Int("records", 0, "records per run, overriding each scenario's default (noop 1000000; io, keys, cpu 50000; pc-volume 10000; crash 20000; adaptive 10000; rate 3000; forward 30000; decode 30000; batch 100000; share 100000); 0 keeps the defaults")
	b.partitions = fs.String("partitions", "", "comma-separated partition `counts` of every topic but pc-volume's and share's (always 1); each scenario runs at each count (default: 8; commits and memory 8,256,1024)")
	b.members = fs.String("members", "1,4,16", "comma-separated group `sizes` of the commits scenario")
	b.handlers = fs.String("handler", "noop,io", "comma-separated `handlers` of the commits scenario: noop, io (a --latency sleep)")
	b.commitIntervals = fs.String("commit-interval", "default", "comma-separated kpar CommitInterval `durations` of the commits scenario; default is the library's (5ms)")
	b.commitBudgets = fs.String("commit-budget", "default", "comma-separated kpar CommitBudget values of the commits scenario, in group `commits/s`; default is the library's (1000), 0 none")
	b.steady = fs.Duration("steady", 3*time.Second, "measured window of each commits cell, after a warm-up (1s; noop 250ms); shorter when the backlog runs low")
	b.kills = fs.Int("kills", 1, "how many times each commits cell with the io handler kills a member at a random moment and replaces it, to count the duplicates; 0 for none")
	b.valueBytes = fs.Int("value-bytes", 100, "value size of the noop, io, keys, cpu, pc-volume and crash records (memory's are 16 bytes)")
	b.latency = fs.Duration("latency", 5*time.Millisecond, "handler latency of the io and keys scenarios (a sleep)")
	b.concurrency = fs.Int("concurrency", 256, "concurrency of the io and keys scenarios (noop, cpu, memory and crash use kpar's default 64; pc-volume 100)")
	b.cpuWork = fs.Duration("cpu-work", 50*time.Microsecond, "CPU time each record burns in the cpu scenario")
	b.backlogs = fs.String("backlogs", "100000,1000000,10000000", "comma-separated backlog `sizes` of the memory scenario")
	b.timeCap = fs.Duration("time-cap", 5*time.Second, "longest a run of io, keys or cpu may take; a slower contender is stopped and rated on what it handled")
	b.fetchMaxWait = fs.Duration("fetch-max-wait", 0, "pass this fetch long-poll wait to every contender's client instead of each one's default (kpar 500ms, franz-go 5s, sarama 500ms); 0 keeps the defaults")
	b.rounds = fs.Int("rounds", 3, "how many times noop runs each contender, and forward and batch alternate the generator and kpar, before reporting each one's median")
	b.cpuProfile = fs.String("cpuprofile", "", "write each run's CPU profile, of its measured interval only, to `PREFIX`-<scenario>-<contender>-<n>.pprof (for go tool pprof)")
	b.jsonOut = fs.Bool("json", false, "print the report as JSON instead of a Markdown table")
	b.brokerProcess = fs.Bool("broker-process", false, "run the broker in a child process instead of in the bench's own, so that the contenders' heap and collector carry none of the broker's records and buffers (not for the crash scenario)")
	if code, ok := fs.parseArgs(args); !ok {
		return nil, code, false
	}
	return b, 0, true
}

// config is the bench.Config the flags ask for.
func (b *benchFlags) config(stderr io.Writer) (bench.Config, int, bool) {
	cfg := bench.Config{
		Records:      *b.records,
		Steady:       *b.steady,
		Kills:        *b.kills,
		ValueBytes:   *b.valueBytes,
		Latency:      *b.latency,
		Concurrency:  *b.concurrency,
		CPUWork:      *b.cpuWork,
		TimeCap:      *b.timeCap,
		Rounds:       *b.rounds,
		FetchMaxWait: *b.fetchMaxWait,
		CPUProfile:   *b.cpuProfile,
		Progress:     stderr,
		Spawn: func(ctx context.Context) *exec.Cmd {
			return exec.CommandContext(ctx, selfExecutable(), "bench", benchChildFlag)
		},
	}
	if *b.brokerProcess {
		cfg.SpawnBroker = func() *exec.Cmd {
			cmd := exec.Command(selfExecutable(), "bench", benchBrokerChildFlag)
			cmd.Stderr = stderr
			return cmd
		}
	}
	if *b.kills == 0 {
		cfg.Kills = -1 // none
	}
	for _, step := range []func(*bench.Config) (int, bool){b.lists, b.commitLists, b.backlogList, b.check} {
		if code, ok := step(&cfg); !ok {
			return cfg, code, false
		}
	}
	return cfg, 0, true
}

// lists reads the scenario, contender, partition, member and handler
// lists.
func (b *benchFlags) lists(cfg *bench.Config) (code int, ok bool) {
	fs := b.fs
	var err error
	if cfg.Scenarios, err = list(*b.scenarios, bench.Scenarios()); err != nil {
		return fs.usageError("invalid --scenario %q: %v", *b.scenarios, err), false
	}
	if cfg.Contenders, err = list(*b.contenders, bench.AllContenders()); err != nil {
		return fs.usageError("invalid --contenders %q: %v", *b.contenders, err), false
	}
	if strings.TrimSpace(*b.partitions) != "" {
		if cfg.PartitionCounts, err = ints(*b.partitions, 1, 4096); err != nil {
			return fs.usageError("invalid --partitions %q: %v", *b.partitions, err), false
		}
	}
	if cfg.Members, err = ints(*b.members, 1, 64); err != nil {
		return fs.usageError("invalid --members %q: %v", *b.members, err), false
	}
	if cfg.Handlers, err = list(*b.handlers, bench.Handlers()); err != nil {
		return fs.usageError("invalid --handler %q: %v", *b.handlers, err), false
	}
	return 0, true
}

// commitLists reads the commits scenario's --commit-interval and
// --commit-budget lists.
func (b *benchFlags) commitLists(cfg *bench.Config) (code int, ok bool) {
	for _, s := range strings.Split(*b.commitIntervals, ",") {
		s = strings.TrimSpace(s)
		if s == "default" {
			cfg.CommitIntervals = append(cfg.CommitIntervals, 0)
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > 10*time.Second {
			return b.fs.usageError("invalid --commit-interval %q: want default or durations from 1ms to 10s, comma-separated", *b.commitIntervals), false
		}
		cfg.CommitIntervals = append(cfg.CommitIntervals, d)
	}
	for _, s := range strings.Split(*b.commitBudgets, ",") {
		s = strings.TrimSpace(s)
		if s == "default" {
			cfg.CommitBudgets = append(cfg.CommitBudgets, -1)
			continue
		}
		budget, err := strconv.ParseFloat(s, 64)
		if err != nil || !(budget >= 0) || budget > 1e6 {
			return b.fs.usageError("invalid --commit-budget %q: want default, 0 or commits a second up to 1000000, comma-separated", *b.commitBudgets), false
		}
		cfg.CommitBudgets = append(cfg.CommitBudgets, budget)
	}
	return 0, true
}

// backlogList reads --backlogs.
func (b *benchFlags) backlogList(cfg *bench.Config) (code int, ok bool) {
	for _, s := range strings.Split(*b.backlogs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 100_000_000 {
			return b.fs.usageError("invalid --backlogs %q: want sizes from 1 to 100000000, comma-separated", *b.backlogs), false
		}
		cfg.Backlogs = append(cfg.Backlogs, n)
	}
	return 0, true
}

// check refuses a value out of its range.
func (b *benchFlags) check(*bench.Config) (code int, ok bool) {
	switch {
	case *b.records < 0 || *b.records > 100_000_000:
		return b.fs.usageError("invalid --records %d: want 0 (the defaults) to 100000000", *b.records), false
	case *b.rounds < 1 || *b.rounds > 99:
		return b.fs.usageError("invalid --rounds %d: want 1 to 99", *b.rounds), false
	case *b.steady <= 0 || *b.steady > 10*time.Minute:
		return b.fs.usageError("invalid --steady %v: want more than 0, up to 10m", *b.steady), false
	case *b.kills < 0 || *b.kills > 100:
		return b.fs.usageError("invalid --kills %d: want 0 to 100", *b.kills), false
	case *b.valueBytes < 1 || *b.valueBytes > 1<<20:
		return b.fs.usageError("invalid --value-bytes %d: want 1 to 1048576", *b.valueBytes), false
	case *b.latency <= 0 || *b.latency > 10*time.Second:
		return b.fs.usageError("invalid --latency %v: want more than 0, up to 10s", *b.latency), false
	case *b.concurrency < 1 || *b.concurrency > 1<<16:
		return b.fs.usageError("invalid --concurrency %d: want 1 to 65536", *b.concurrency), false
	case *b.cpuWork <= 0 || *b.cpuWork > time.Second:
		return b.fs.usageError("invalid --cpu-work %v: want more than 0, up to 1s", *b.cpuWork), false
	case *b.timeCap <= 0:
		return b.fs.usageError("invalid --time-cap %v: want more than 0", *b.timeCap), false
	case *b.fetchMaxWait < 0 || *b.fetchMaxWait > time.Minute:
		return b.fs.usageError("invalid --fetch-max-wait %v: want 0 (the defaults) to 1m", *b.fetchMaxWait), false
	}
	return 0, true
}

// ints parses a comma-separated list of distinct integers from lo to hi,
// keeping their order.
func ints(s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("want numbers from %d to %d, comma-separated", lo, hi)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// list parses a comma-separated list of names from all ("all" for every
// one), keeping all's order.
func list(s string, all []string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		return all, nil
	}
	var out []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(all, n) {
			return nil, fmt.Errorf("unknown name %q: want %s, or all", n, strings.Join(all, ", "))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}
