package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/kparprom"
)

// withoutKparEnv clears the KPAR_* variables of the test's environment (a
// test run may set KPAR_TEST_POSTGRES), which --check-config would report
// as unknown; t.Setenv puts them back afterwards.
func withoutKparEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "KPAR_") {
			t.Setenv(name, "")
			os.Unsetenv(name)
		}
	}
}

// A dry run with brokers, an endpoint and a status port that nothing could
// use (nothing listens at the brokers or the endpoint, and the port is
// taken) succeeds: it contacts none of them, creates no dead-letter file,
// and prints the start line's fields and the status paths.
func TestForwardCheckConfigPrintsWhatItWouldDoAndContactsNothing(t *testing.T) {
	withoutKparEnv(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	letters := filepath.Join(t.TempDir(), "dead.jsonl")
	t.Setenv("KPAR_CONCURRENCY", "32") // variables are checked too
	var stdout, stderr bytes.Buffer
	code := cmdForward(t.Context(), []string{
		"--check-config", "--brokers", "127.0.0.1:1", "--group", "billing", "--topic", "orders",
		"--url", "http://127.0.0.1:1/orders", "--content-type", "application/json",
		"--dead-letters", "file://" + letters, "--metrics-listen", taken.Addr().String(),
	}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{
		"the configuration is valid",
		"  brokers: 127.0.0.1:1\n", "  group: billing\n", "  topics: orders\n", "  concurrency: 32\n",
		"  url: http://127.0.0.1:1/orders\n", "  content_type: application/json unless the record has a content-type header\n",
		"  dead_letters: file://" + letters + "\n",
		"  metrics_listen: " + taken.Addr().String() + "\n",
		"  status_paths: /,/metrics,/healthz,/readyz,/api/status\n",
		"  shutdown_timeout: 30s\n",
		"not contacted: the brokers, the --url endpoint and the dead-letter sink",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	if strings.Contains(stderr.String(), "starting") {
		t.Errorf("a dry run logged a start:\n%s", stderr.String())
	}
	if _, err := os.Stat(letters); !os.IsNotExist(err) {
		t.Errorf("the dead-letter file was touched (stat: %v)", err)
	}
}

// Every bad configuration exits 2 with one line naming what is wrong: a
// bad flag, a bad combination, a bad variable, an option the library
// refuses (in the flags' words: the daemon asks the library before it
// starts, and exits 2 too), and
// a KPAR_* variable no flag reads (misspelt, it would be ignored silently).
func TestForwardCheckConfigRefusesABadConfiguration(t *testing.T) {
	base := []string{"--check-config", "--brokers", "127.0.0.1:9092", "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:8080/in"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		says string
	}{
		{"bad flag", append(slices.Clone(base), "--concurrency", "0"), nil, "--concurrency"},
		{"bad combination", append(slices.Clone(base), "--exactly-once", "--dead-letters", "file:///tmp/x"), nil, "--exactly-once"},
		{"bad variable", base, map[string]string{"KPAR_ORDERING": "random"}, "KPAR_ORDERING"},
		{"refused by the library", append(slices.Clone(base), "--commit-interval", "0s"), nil, "--commit-interval 0s out of range"},
		{"unknown variable", base, map[string]string{"KPAR_CONCURENCY": "8"}, "unknown KPAR_CONCURENCY"},
		{"two unknown variables", base, map[string]string{"KPAR_A": "1", "KPAR_B": "2"}, "unknown KPAR_A, KPAR_B"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withoutKparEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			if code := cmdForward(t.Context(), tc.args, &stdout, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if msg := stderr.String(); strings.Count(msg, "\n") != 1 || !strings.Contains(msg, tc.says) {
				t.Errorf("stderr = %q, want one line saying %s", msg, tc.says)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

// The paths --check-config names as the status server's are the ones it
// serves: deploy/'s test checks the probes against that list.
func TestForwardCheckConfigStatusPathsAreServed(t *testing.T) {
	c, err := kpar.New(kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		kpar.Brokers("127.0.0.1:1"), kpar.Group("g"), kpar.Topics("t"))
	if err != nil {
		t.Fatal(err)
	}
	m := kparprom.New()
	srv := httptest.NewServer(statusHandler(c, m, func() (bool, string) { return true, "test" }, prometheus.Gatherers{m.Registry()}))
	defer srv.Close()
	for _, path := range statusPaths {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s, want 200 OK", path, resp.Status)
		}
	}
	resp, err := srv.Client().Get(srv.URL + "/nothing-here")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nothing-here: %s, want 404 (the list would then prove nothing)", resp.Status)
	}
}
