package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fastDemo keeps the demo's simulated handler short, for test time.
var fastDemo = []string{"--max-latency", "1ms", "--concurrency", "512"}

// runDemo runs cmdDemo in process and returns its exit code and output.
func runDemo(ctx context.Context, t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cmdDemo(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// demoJSON parses the --json summary: exactly one line holding one object
// with exactly the six documented keys. lost is -1 when null.
func demoJSON(t *testing.T, stdout string) (produced, handled, duplicates, lost, violations int64, seconds float64) {
	t.Helper()
	if strings.Count(stdout, "\n") != 1 || !strings.HasSuffix(stdout, "\n") {
		t.Fatalf("stdout is not one line:\n%s", stdout)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s", err, stdout)
	}
	var keys []string
	for k := range raw {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"commit_violations", "duplicates", "handled", "lost", "order_violations", "produced", "seconds"}
	if !slices.Equal(keys, want) {
		t.Fatalf("JSON keys = %v, want exactly %v", keys, want)
	}
	var s struct {
		Produced, Handled, Duplicates int64
		Lost                          *int64
		OrderViolations               int64 `json:"order_violations"`
		Seconds                       float64
	}
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("JSON values: %v\n%s", err, stdout)
	}
	lost = -1
	if s.Lost != nil {
		lost = *s.Lost
	}
	return s.Produced, s.Handled, s.Duplicates, lost, s.OrderViolations, s.Seconds
}

func TestDemoHandlesEveryRecordOnceInKeyOrder(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	code, stdout, stderr := runDemo(ctx, t, append([]string{"--records", "20000", "--json"}, fastDemo...)...)
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	produced, handled, duplicates, lost, violations, seconds := demoJSON(t, stdout)
	if produced != 20000 || handled != 20000 || lost != 0 || violations != 0 {
		t.Errorf("produced %d, handled %d, lost %d, order violations %d; want 20000, 20000, 0, 0",
			produced, handled, lost, violations)
	}
	// One member and no rebalance: nothing is delivered twice.
	if duplicates != 0 {
		t.Errorf("duplicates = %d, want 0 in a clean single-member run", duplicates)
	}
	if seconds <= 0 {
		t.Errorf("seconds = %v, want more than 0", seconds)
	}
	if !strings.Contains(stderr, "handled 20000/20000") {
		t.Errorf("stderr has no final progress line:\n%s", stderr)
	}
}

func TestDemoOrderingModes(t *testing.T) {
	for _, tc := range []struct {
		ordering string
		records  string
		ordered  bool
	}{
		// Partition mode runs one record per partition at a time: fewer
		// records keep it short.
		{"partition", "4000", true},
		{"unordered", "20000", false},
		{"key", "5000", true},
	} {
		t.Run(tc.ordering, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			args := append([]string{"--records", tc.records, "--ordering", tc.ordering, "--json"}, fastDemo...)
			if tc.ordering == "key" {
				// Failed attempts are retried and still keep the order.
				args = append(args, "--fail-rate", "0.2")
			}
			code, stdout, stderr := runDemo(ctx, t, args...)
			if code != 0 {
				t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
			}
			produced, handled, _, lost, violations, _ := demoJSON(t, stdout)
			if produced != handled || lost != 0 || produced == 0 {
				t.Errorf("produced %d, handled %d, lost %d; want all handled, none lost", produced, handled, lost)
			}
			if tc.ordered && violations != 0 {
				t.Errorf("order violations = %d, want 0 in %s mode", violations, tc.ordering)
			}
		})
	}
}

func TestDemoPrintsTextSummary(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	code, stdout, stderr := runDemo(ctx, t, append([]string{"--records", "2000", "--keys", "10", "--partitions", "3"}, fastDemo...)...)
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{
		"2000 records on 3 partitions, 10 keys, ordering key",
		"produced          2000\n",
		"handled           2000\n",
		"lost              0\n",
		"order violations  0\n",
		"committed         2000\n",
		"ok: every record handled",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
}

func TestDemoInterruptedReportsSoFar(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// Partition mode with a slow handler takes over ten seconds for these
	// records; Ctrl-C comes at the first progress line (one a second) that
	// reports handled records. On a slow machine the first lines can come
	// while producing, before any record was handled.
	runCtx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	stderr := newWatchWriter()
	go func() {
		if stderr.await(ctx, nil, func() bool { return handledSome.Match(stderr.buf.Bytes()) }) {
			interrupt()
		}
	}()
	var stdout bytes.Buffer
	code := cmdDemo(runCtx, []string{"--records", "100000", "--ordering", "partition", "--max-latency", "2ms", "--json"}, &stdout, stderr)
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	produced, handled, duplicates, lost, violations, _ := demoJSON(t, stdout.String())
	if lost != -1 {
		t.Errorf("lost = %d, want null after an interruption", lost)
	}
	if handled == 0 || handled >= produced || duplicates != 0 || violations != 0 {
		t.Errorf("produced %d, handled %d, duplicates %d, order violations %d; want some but not all handled, no duplicates or violations",
			produced, handled, duplicates, violations)
	}
	if !strings.Contains(stderr.String(), "stopping:") {
		t.Errorf("stderr does not say it is stopping:\n%s", stderr)
	}
}

// handledSome matches a progress line that reports handled records.
var handledSome = regexp.MustCompile(`handled [1-9][0-9]*/`)

func TestDemoRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  [2]string
		name string // in the error line
	}{
		{args: []string{"--records", "0"}, name: "--records"},
		{args: []string{"--records", "many"}, name: "records"},
		{args: []string{"--partitions", "0"}, name: "--partitions"},
		{args: []string{"--keys", "-1"}, name: "--keys"},
		{args: []string{"--concurrency", "0"}, name: "--concurrency"},
		{args: []string{"--ordering", "sideways"}, name: "--ordering"},
		{args: []string{"--max-latency", "-1ms"}, name: "--max-latency"},
		{args: []string{"--max-latency", "soon"}, name: "max-latency"},
		{args: []string{"--fail-rate", "1"}, name: "--fail-rate"},
		{args: []string{"--fail-rate", "NaN"}, name: "--fail-rate"},
		{args: []string{"--loss", "0"}, name: "loss"},
		{args: []string{"extra"}, name: `"extra"`},
		{env: [2]string{"KPAR_RECORDS", "lots"}, name: "KPAR_RECORDS (flag --records)"},
	} {
		name := strings.Join(tc.args, " ")
		if tc.env[0] != "" {
			name = tc.env[0] + "=" + tc.env[1]
		}
		t.Run(name, func(t *testing.T) {
			if tc.env[0] != "" {
				t.Setenv(tc.env[0], tc.env[1])
			}
			code, stdout, stderr := runDemo(t.Context(), t, tc.args...)
			if code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.name) {
				t.Errorf("stderr = %q, want one line naming %s", stderr, tc.name)
			}
		})
	}
}
