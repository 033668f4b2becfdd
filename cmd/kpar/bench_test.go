package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kpar/kpar/cmd/kpar/bench"
)

func runBench(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code = cmdBench(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestBenchNoopJSON(t *testing.T) {
	code, stdout, stderr := runBench(t, "--scenario", "noop", "--records", "20000", "--json")
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, stderr)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, stdout)
	}
	if len(rep.Results) != len(bench.Contenders()) {
		t.Fatalf("%d results, want one per contender (%d)", len(rep.Results), len(bench.Contenders()))
	}
	for _, res := range rep.Results {
		if res.Scenario != bench.Noop || res.Records != 20000 || res.RecordsPerSec <= 0 || res.Lost != 0 || res.Err != "" {
			t.Errorf("%s: %+v", res.Contender, res)
		}
		if res.RatioTo != "raw" {
			t.Errorf("%s: ratio to %q, want raw", res.Contender, res.RatioTo)
		}
	}
}

func TestBenchMarkdownFromEnvironment(t *testing.T) {
	t.Setenv("KPAR_CONTENDERS", "raw,kpar-key")
	t.Setenv("KPAR_RECORDS", "3000")
	code, stdout, stderr := runBench(t, "--scenario", "noop")
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, stderr)
	}
	for _, want := range []string{"| scenario | variant | contender |", "| noop | - | raw | 3,000 |", "| noop | - | kpar-key | 3,000 |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "naive-pool") {
		t.Errorf("KPAR_CONTENDERS was ignored:\n%s", stdout)
	}
}

func TestBenchRejectsBadUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown scenario", nil, []string{"--scenario", "noop,bogus"}, "--scenario"},
		{"unknown contender", nil, []string{"--contenders", "kafka-streams"}, "--contenders"},
		{"negative records", nil, []string{"--records", "-1"}, "--records"},
		{"zero partitions", nil, []string{"--partitions", "0"}, "--partitions"},
		{"zero latency", nil, []string{"--latency", "0s"}, "--latency"},
		{"zero concurrency", nil, []string{"--concurrency", "0"}, "--concurrency"},
		{"bad backlogs", nil, []string{"--backlogs", "1000,lots"}, "--backlogs"},
		{"zero time cap", nil, []string{"--time-cap", "0s"}, "--time-cap"},
		{"zero rounds", nil, []string{"--rounds", "0"}, "--rounds"},
		{"a partition list with a word", nil, []string{"--partitions", "8,many"}, "--partitions"},
		{"too many partitions", nil, []string{"--partitions", "5000"}, "--partitions"},
		{"zero members", nil, []string{"--members", "1,0"}, "--members"},
		{"unknown handler", nil, []string{"--handler", "noop,cpu"}, "--handler"},
		{"zero commit interval", nil, []string{"--commit-interval", "default,0s"}, "--commit-interval"},
		{"negative kills", nil, []string{"--kills", "-1"}, "--kills"},
		{"zero steady window", nil, []string{"--steady", "0s"}, "--steady"},
		{"not a duration in the environment", map[string]string{"KPAR_CPU_WORK": "fast"}, nil, "KPAR_CPU_WORK"},
		{"unknown flag", nil, []string{"--turbo"}, "turbo"},
		{"stray argument", nil, []string{"noop"}, "unexpected argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, stdout, stderr := runBench(t, tc.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			if !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("stderr should be one line naming %q, got:\n%s", tc.want, stderr)
			}
		})
	}
}

// TestBenchCommitsTable runs one small commits cell and reads its table.
func TestBenchCommitsTable(t *testing.T) {
	code, stdout, stderr := runBench(t, "--scenario", "commits", "--partitions", "4", "--members", "2", "--handler", "io",
		"--latency", "1ms", "--concurrency", "16", "--records", "100000", "--steady", "300ms", "--commit-interval", "10ms")
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, stderr)
	}
	for _, want := range []string{"| partitions | handler | members | commit interval, group budget |", "| 4 | 1ms | 2 | 10ms, budget default |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "| scenario |") {
		t.Errorf("the runs table printed for the commits scenario alone:\n%s", stdout)
	}
}
