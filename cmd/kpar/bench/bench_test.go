package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain doubles as the memory scenario's child process: with
// KPAR_BENCH_CHILD=1 the test binary serves one child run and exits.
func TestMain(m *testing.M) {
	if os.Getenv("KPAR_BENCH_BROKER_CHILD") == "1" {
		if err := ServeBroker(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv("KPAR_BENCH_CHILD") == "1" {
		if err := ServeChild(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if shared != nil {
		shared.close()
	}
	os.Exit(code)
}

func spawnTestChild(ctx context.Context) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KPAR_BENCH_CHILD=1")
	return cmd
}

func spawnTestBroker() *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KPAR_BENCH_BROKER_CHILD=1")
	cmd.Stderr = os.Stderr
	return cmd
}

// runSmall runs cfg, its progress on stderr with -v.
func runSmall(t *testing.T, cfg Config) *Report {
	t.Helper()
	if testing.Verbose() {
		cfg.Progress = os.Stderr
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestRunSmallNoop(t *testing.T) {
	cfg := Config{Scenarios: []string{Noop}, Contenders: []string{Raw, NaivePool, BatchPool, KparUnordered}, Records: 3000, Rounds: 5}
	rep := runSmall(t, cfg)
	if len(rep.Results) != 4 {
		t.Fatalf("%d results, want 4", len(rep.Results))
	}
	if rep.Config.Rounds != 5 {
		t.Errorf("report says %d rounds, want 5", rep.Config.Rounds)
	}
	for _, res := range rep.Results {
		if res.Err != "" || res.Records != 3000 || res.Lost != 0 || res.Duplicates != 0 || res.RatioTo != "raw" ||
			!strings.Contains(res.Note, "median of 5") {
			t.Errorf("%s: %+v", res.Contender, res)
		}
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil || !bytes.Contains(md.Bytes(), []byte("| noop | - | kpar-unordered | 3,000 |")) {
		t.Errorf("markdown (%v):\n%s", err, md.String())
	}
}

// TestRunSmallShare runs the share scenario small: every contender reads
// the whole one-partition topic, share groups and backfill included.
func TestRunSmallShare(t *testing.T) {
	cfg := Config{Scenarios: []string{Share}, Contenders: []string{KparUnordered, Backfill2, KparShare, RawShare},
		Records: 2000, Latency: time.Millisecond, Concurrency: 16, TimeCap: 2 * time.Second}
	rep := runSmall(t, cfg)
	if len(rep.Results) != 8 {
		t.Fatalf("%d results, want 8 (4 contenders, 2 variants)", len(rep.Results))
	}
	for _, res := range rep.Results {
		if res.Err != "" || res.Lost != 0 || res.RatioTo != "raw-share" || (res.Records != 2000 && !res.Capped) {
			t.Errorf("%s %s: %+v", res.Variant, res.Contender, res)
		}
	}
}

// TestCrashShowsNaivePoolLoss runs the crash scenario small: kpar loses
// nothing, and the naive pool loses records. How many depends on what is in
// flight at the kill, so the naive pool gets three tries to show it.
func TestCrashShowsNaivePoolLoss(t *testing.T) {
	cfg := Config{Scenarios: []string{Crash}, Contenders: []string{NaivePool, KparUnordered}, Records: 4000}
	naiveLost := false
	for try := 0; try < 3 && !naiveLost; try++ {
		rep := runSmall(t, cfg)
		for _, res := range rep.Results {
			if res.Err != "" {
				t.Fatalf("%s: %s", res.Contender, res.Err)
			}
			switch res.Contender {
			case NaivePool:
				naiveLost = res.Lost > 0
			case KparUnordered:
				if res.Lost != 0 {
					t.Fatalf("kpar lost %d records: %+v", res.Lost, res)
				}
			}
		}
	}
	if !naiveLost {
		t.Error("the naive pool lost nothing in three crashes")
	}
}

func TestMemoryChildReportsPeakRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	cfg := Config{Scenarios: []string{Memory}, Contenders: []string{KparKey}, Backlogs: []int{2000, 4000},
		PartitionCounts: []int{2, 16}, Spawn: spawnTestChild}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Both backlogs at 2 partitions, the first again at 16.
	if len(rep.Results) != 3 {
		t.Fatalf("%d results, want 3: %+v", len(rep.Results), rep.Results)
	}
	for i, want := range []struct {
		variant string
		records int64
	}{{"2 partitions, backlog 2,000", 2000}, {"2 partitions, backlog 4,000", 4000}, {"16 partitions, backlog 2,000", 2000}} {
		res := rep.Results[i]
		if res.Err != "" || res.PeakRSS <= 0 || res.Records != want.records || res.Variant != want.variant {
			t.Errorf("result %d: %+v, want %q with %d records", i, res, want.variant, want.records)
		}
		if slope := res.Target == 2000; slope != strings.Contains(res.Note, "RSS per partition") {
			t.Errorf("result %d: note %q; the slope belongs on the first backlog's rows only", i, res.Note)
		}
	}
}

func TestPerPartitionIsTheSlopeOverPartitionCounts(t *testing.T) {
	const mib, kib = 1 << 20, 1 << 10
	out := []Result{
		{Contender: Raw, Target: 100, PeakRSS: 40 * mib},
		{Contender: KparKey, Target: 100, PeakRSS: 50 * mib},
		{Contender: KparKey, Target: 1000, PeakRSS: 90 * mib}, // another backlog: not a point
		{Contender: Raw, Target: 100, PeakRSS: 40*mib + 1016*kib},
		{Contender: KparKey, Target: 100, PeakRSS: 50*mib + 1016*3*kib},
	}
	parts := []int{8, 8, 8, 1024, 1024}
	perPartition(out, parts, 100)
	for i, want := range []int64{kib, 3 * kib, 0, kib, 3 * kib} {
		if out[i].RSSPerPartition != want {
			t.Errorf("result %d (%s): %d bytes per partition, want %d", i, out[i].Contender, out[i].RSSPerPartition, want)
		}
	}
}

// TestPartitionCountsRunNoopAtEach runs noop at two partition counts: each
// count's runs have their own ratio to raw and name their count.
func TestPartitionCountsRunNoopAtEach(t *testing.T) {
	cfg := Config{Scenarios: []string{Noop}, Contenders: []string{Raw, KparKey}, Records: 3000, Rounds: 1, PartitionCounts: []int{2, 16}}
	rep := runSmall(t, cfg)
	var got []string
	for _, res := range rep.Results {
		got = append(got, res.Variant+" "+res.Contender)
		if res.Err != "" || res.Records != 3000 || res.RatioTo != "raw" {
			t.Errorf("%s %s: %+v", res.Variant, res.Contender, res)
		}
	}
	want := []string{"2 partitions raw", "2 partitions kpar-key", "16 partitions raw", "16 partitions kpar-key"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("runs %q, want %q", got, want)
	}
}

// TestRunSmallCommits runs small commits cells with a kill each, under
// the default group budget and one of 20 commits a second: the hook's
// counts agree with the broker's, a budget bounds the group's commits, and
// a kill costs at most the records in flight plus what finished since the
// last commit.
func TestRunSmallCommits(t *testing.T) {
	cfg := Config{Scenarios: []string{Commits}, PartitionCounts: []int{4}, Members: []int{1, 3}, Handlers: []string{HandlerIO},
		Latency: time.Millisecond, Concurrency: 16, Records: 150_000, Steady: 500 * time.Millisecond, Kills: 1,
		CommitIntervals: []time.Duration{10 * time.Millisecond}, CommitBudgets: []float64{-1, 20}}
	rep := runSmall(t, cfg)
	if len(rep.Results) != 4 {
		t.Fatalf("%d results, want 4: %+v", len(rep.Results), rep.Results)
	}
	for _, res := range rep.Results {
		ct := res.Commits
		if res.Err != "" || ct == nil {
			t.Fatalf("%s: %+v", res.Variant, res)
		}
		if ct.GroupCommitsPerSec <= 0 || ct.PartitionsPerCommit < 1 || ct.BytesPerCommit <= 0 || ct.CommitRTTMs <= 0 || res.RecordsPerSec <= 0 {
			t.Errorf("%s: %+v", res.Variant, *ct)
		}
		// Every request kpar reported reached the broker. The broker
		// counts a request when it arrives, the hook when its answer
		// does, so at each edge of the window a member's request in
		// flight (one at a time: its commits are serial) counts on one
		// side only: up to one per member, either way. (A bound of 2
		// failed 2 of 20 -race runs beside two CPU hogs with 3 members:
		// 3 more at the broker.)
		tol := float64(ct.Members)
		if d := ct.BrokerCommitsPerSec - ct.GroupCommitsPerSec; d*ct.WindowSeconds > tol+0.5 || d*ct.WindowSeconds < -tol-0.5 {
			t.Errorf("%s: hook %.1f commits/s, broker %.1f", res.Variant, ct.GroupCommitsPerSec, ct.BrokerCommitsPerSec)
		}
		// A 10ms interval at most: 100 a second per member, and a
		// commit round trip on top.
		if ct.MaxMemberCommitsPerSec > 110 {
			t.Errorf("%s: a member sent %.0f commits/s with a 10ms CommitInterval", res.Variant, ct.MaxMemberCommitsPerSec)
		}
		// 20 a second for the group; a short window's edges and a
		// commit at each member's first settle may add a few.
		if ct.CommitBudget == "20/s" && ct.GroupCommitsPerSec > 32 {
			t.Errorf("%s: the group sent %.0f commits/s within a budget of 20", res.Variant, ct.GroupCommitsPerSec)
		}
		if ct.Kills != 1 || ct.InFlightPerKill > 16 || ct.DupsPerKill <= 0 {
			t.Errorf("%s: kills %+v", res.Variant, *ct)
		}
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil || !strings.Contains(md.String(), "| 4 | 1ms | 3 | 10ms, budget 20/s |") {
		t.Errorf("markdown (%v):\n%s", err, md.String())
	}
}

// ---- go test -bench ----

var (
	sharedOnce sync.Once
	shared     *runner
	sharedErr  error
)

// benchRunner is one broker for every benchmark of the process.
func benchRunner(b *testing.B) *runner {
	sharedOnce.Do(func() {
		cfg := DefaultConfig()
		shared, sharedErr = newRunner(cfg)
	})
	if sharedErr != nil {
		b.Fatal(sharedErr)
	}
	return shared
}

var benchTopics int

// benchScenario runs each contender on a fresh topic of b.N records and
// reports records/s; one op is one record.
func benchScenario(b *testing.B, scenario string, names []string, keys int, w func() work, concurrency int) {
	r := benchRunner(b)
	for _, name := range names {
		c, ok := contenderNamed(name)
		b.Run(name, func(b *testing.B) {
			if !ok {
				b.Skipf("%s is not in this build (go test -tags sarama)", name)
			}
			b.ReportAllocs()
			ctx := context.Background()
			benchTopics++
			t, err := r.topic(ctx, fmt.Sprintf("bench-%s-%d", scenario, benchTopics), 8, keys, 100, int64(b.N))
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ResetTimer()
			res := r.measure(ctx, runSpec{scenario: scenario, c: c, t: t, work: w(), concurrency: concurrency,
				onStart: b.StartTimer, onStop: b.StopTimer})
			if res.Err != "" {
				b.Fatal(res.Err)
			}
			b.ReportMetric(res.RecordsPerSec, "records/s")
			if res.P99Ms != nil {
				b.ReportMetric(*res.P99Ms, "p99-ms")
			}
		})
	}
}

func BenchmarkNoop(b *testing.B) {
	benchScenario(b, Noop, Contenders(), 100_000, func() work { return noWork }, defaultConcurrency)
}

func BenchmarkIO(b *testing.B) {
	benchScenario(b, IO, []string{PerPartition, NaivePool, KparKey, KparPartition, KparUnordered, Sarama}, 100_000,
		func() work { return sleepWork(5 * time.Millisecond) }, 256)
}

func BenchmarkKeys1000(b *testing.B) {
	benchScenario(b, Keys, []string{KparKey, KparUnordered}, 1000,
		func() work { return sleepWork(5 * time.Millisecond) }, 256)
}

func BenchmarkCPU(b *testing.B) {
	iters := calibrateBurn(50 * time.Microsecond)
	benchScenario(b, CPU, Contenders(), 100_000, func() work { return burnWork(iters) }, defaultConcurrency)
}

// TestRunSmallFlow runs the forwarding scenarios small: every record is
// delivered or dead-lettered, nothing lost, each with its ratio, and
// forward and batch with each contender's CPU per record.
func TestRunSmallFlow(t *testing.T) {
	cfg := Config{Scenarios: []string{Adaptive, Rate, Forward, Batch}, Records: 600}
	rep := runSmall(t, cfg)
	want := map[string]string{Adaptive: "capacity", Rate: "1s", Forward: "generator", Batch: "generator"}
	if len(rep.Results) != 7 {
		t.Fatalf("%d results, want 7: %+v", len(rep.Results), rep.Results)
	}
	for _, res := range rep.Results {
		if res.Err != "" || res.Lost != 0 || res.Records != res.Target {
			t.Errorf("%s %s %s: %+v", res.Scenario, res.Variant, res.Contender, res)
		}
		if res.Contender == KparForward && res.RatioTo != want[res.Scenario] {
			t.Errorf("%s %s: ratio to %q, want %q", res.Scenario, res.Variant, res.RatioTo, want[res.Scenario])
		}
		if (res.Scenario == Forward || res.Scenario == Batch) && !strings.Contains(res.Note, "µs CPU/") {
			t.Errorf("%s %s %s: note %q gives no CPU per record", res.Scenario, res.Variant, res.Contender, res.Note)
		}
	}
}

// TestRunSmallDecode runs the decode scenario small: every record of
// both formats is delivered decoded and raw, none dead-lettered, and the
// decoded run has its ratio to the raw one.
func TestRunSmallDecode(t *testing.T) {
	rep := runSmall(t, Config{Scenarios: []string{Decode}, Records: 600})
	if len(rep.Results) != 4 {
		t.Fatalf("%d results, want 4: %+v", len(rep.Results), rep.Results)
	}
	for i, res := range rep.Results {
		if res.Err != "" || res.Lost != 0 || res.Records != res.Target || !strings.Contains(res.Note, "dead letters 0") && i%2 == 1 {
			t.Errorf("%s %s: %+v", res.Scenario, res.Variant, res)
		}
		if i%2 == 1 && res.RatioTo != "raw bytes" {
			t.Errorf("%s: ratio to %q, want raw bytes", res.Variant, res.RatioTo)
		}
	}
}

// TestBrokerInAChildProcess runs noop small against a broker in a child
// process (Config.SpawnBroker): the gate holds and opens across the pipe,
// every record is handled, and the crash scenario, which needs the broker
// in process, says so instead of running.
func TestBrokerInAChildProcess(t *testing.T) {
	cfg := Config{Scenarios: []string{Noop, Crash}, Contenders: []string{Raw, KparUnordered}, Records: 3000, SpawnBroker: spawnTestBroker}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	noop, crash := 0, 0
	for _, res := range rep.Results {
		switch res.Scenario {
		case Noop:
			noop++
			if res.Err != "" || res.Records != res.Target || res.Lost != 0 {
				t.Errorf("noop %s: %+v", res.Contender, res)
			}
		case Crash:
			crash++
			if !strings.Contains(res.Err, "needs the broker in the bench's process") {
				t.Errorf("crash %s: err %q, want the in-process broker asked for", res.Contender, res.Err)
			}
		}
	}
	if noop != 2 || crash == 0 {
		t.Errorf("%d noop and %d crash results: %+v", noop, crash, rep.Results)
	}
}

func TestMemoryChildWritesItsHeapProfileNearItsPeakWhenAsked(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	prefix := filepath.Join(t.TempDir(), "heap")
	t.Setenv(heapProfileEnv, prefix) // the child inherits it
	cfg := Config{Scenarios: []string{Memory}, Contenders: []string{KparKey}, Backlogs: []int{2000},
		PartitionCounts: []int{2}, Spawn: spawnTestChild}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || rep.Results[0].Err != "" {
		t.Fatalf("results %+v, want one run without error", rep.Results)
	}
	b, err := os.ReadFile(prefix + "-" + KparKey + ".pprof")
	if err != nil {
		t.Fatal(err)
	}
	// pprof's protobuf format, gzipped.
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("the profile is %d bytes and not gzipped: not a pprof profile", len(b))
	}
}
