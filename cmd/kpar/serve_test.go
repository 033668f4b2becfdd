package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/internal/testkit"
	"github.com/kpar/kpar/kparprom"
)

// chromiumPath is Debian's chromium, which the page test drives headless.
const chromiumPath = "/usr/bin/chromium"

// statusFixture is a consumer on a kfake cluster, observed by Metrics and
// served by serveStatus, as `kpar forward --metrics-listen` wires it.
type statusFixture struct {
	cluster *kfake.Cluster
	cons    *kpar.Consumer
	metrics *kparprom.Metrics
	base    string // http://host:port
	client  *http.Client
	stop    context.CancelFunc // stops the server
}

// newStatusFixture starts a cluster with topic "t" of partitions
// partitions holding records records, a consumer running h (not yet
// running: see run), and the status server on a free port.
func newStatusFixture(t *testing.T, partitions int32, records int, h kpar.HandlerFunc, extra ...kpar.ConsumerOpt) *statusFixture {
	t.Helper()
	return newReadyFixture(t, nil, partitions, records, h, extra...)
}

// newReadyFixture is newStatusFixture with /readyz from ready's progress
// too (nil: membership only); ready observes the consumer.
func newReadyFixture(t *testing.T, ready *stallWatch, partitions int32, records int, h kpar.HandlerFunc, extra ...kpar.ConsumerOpt) *statusFixture {
	t.Helper()
	if ready != nil {
		extra = append(extra, ready.opts()...)
	}
	// Registered first, so it runs after every other cleanup.
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })

	cluster := testkit.Cluster(t, kfake.SeedTopics(partitions, "t"), kfake.GroupMinSessionTimeout(100*time.Millisecond))

	if records > 0 {
		rs := make([]*kgo.Record, records)
		for i := range rs {
			rs[i] = &kgo.Record{Topic: "t", Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}
		}
		testkit.Produce(t, cluster.ListenAddrs(), rs...)
	}

	m := kparprom.New()
	copts := append([]kgo.Opt{
		kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.SessionTimeout(2 * time.Second),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}, m.ClientOpts()...)
	cons, err := kpar.New(h, append([]kpar.ConsumerOpt{kpar.Group("g"), kpar.Topics("t"), kpar.CommitInterval(50 * time.Millisecond),
		kpar.ShutdownTimeout(10 * time.Second), kpar.ClientOptions(copts...), kpar.WithHooks(m)}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}

	return serveReadyFixture(t, cluster, cons, m, ready)
}

// serveFixture serves cons and m on a free port until the test ends (or
// the fixture's stop), with a client for it.
func serveFixture(t *testing.T, cluster *kfake.Cluster, cons *kpar.Consumer, m *kparprom.Metrics) *statusFixture {
	t.Helper()
	return serveReadyFixture(t, cluster, cons, m, nil)
}

// serveReadyFixture is serveFixture with /readyz from ready's progress too.
func serveReadyFixture(t *testing.T, cluster *kfake.Cluster, cons *kpar.Consumer, m *kparprom.Metrics, ready *stallWatch) *statusFixture {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	addr, err := serveStatus(ctx, "127.0.0.1:0", cons, m, ready)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &statusFixture{
		cluster: cluster, cons: cons, metrics: m, stop: stop,
		base:   "http://" + addr,
		client: &http.Client{Transport: tr, Timeout: 10 * time.Second},
	}
}

// run runs the consumer until the test ends and waits until it is ready.
func (f *statusFixture) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.cons.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of cancel")
		}
	})
	f.waitFor(t, "the consumer ready", func() bool { ok, _ := f.metrics.Ready(); return ok })
}

func (f *statusFixture) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 20s waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get returns the status and body of GET path.
func (f *statusFixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := f.client.Get(f.base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

func (f *statusFixture) apiStatus(t *testing.T) statusResponse {
	t.Helper()
	code, body := f.get(t, "/api/status")
	if code != http.StatusOK {
		t.Fatalf("GET /api/status: %d %s", code, body)
	}
	var s statusResponse
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("GET /api/status: %v in %s", err, body)
	}
	return s
}

func TestServeStatusEndpoints(t *testing.T) {
	const records = 40
	f := newStatusFixture(t, 4, records, func(context.Context, *kgo.Record) error { return nil })

	t.Run("before the consumer runs", func(t *testing.T) {
		if code, body := f.get(t, "/healthz"); code != http.StatusOK || body != "ok\n" {
			t.Errorf("GET /healthz = %d %q, want 200 \"ok\\n\"", code, body)
		}
		if code, body := f.get(t, "/readyz"); code != http.StatusServiceUnavailable || body != "not ready: consumer not started\n" {
			t.Errorf("GET /readyz = %d %q, want 503 \"not ready: consumer not started\\n\"", code, body)
		}
		if s := f.apiStatus(t); s.Ready || s.Partitions == nil || len(s.Partitions) != 0 || s.DeadLetters == nil {
			t.Errorf("GET /api/status = %+v, want not ready, with empty (not null) lists", s)
		}
	})

	f.run(t)
	f.waitFor(t, "every record handled and committed", func() bool {
		s := f.apiStatus(t)
		lag := int64(0)
		for _, p := range s.Partitions {
			lag += p.Lag
		}
		return s.Totals.Handled == records && len(s.Partitions) == 4 && lag == 0
	})

	t.Run("running", func(t *testing.T) {
		if code, body := f.get(t, "/readyz"); code != http.StatusOK || body != "ready: 4 partitions assigned in group g\n" {
			t.Errorf("GET /readyz = %d %q, want 200 \"ready: 4 partitions assigned in group g\\n\"", code, body)
		}
		code, body := f.get(t, "/metrics")
		if code != http.StatusOK {
			t.Fatalf("GET /metrics = %d", code)
		}
		for _, want := range []string{
			`kpar_records_handled_total{topic="t"} 40`,
			`kpar_ready 1`,
			`kpar_attempts_overdue 0`,
			`kpar_partitions_assigned 4`,
			`kpar_partition_commit_lag{partition="0",topic="t"} 0`,
			`kpar_partition_window_end{partition="3",topic="t"}`,
			`kpar_handler_latency_seconds_count{topic="t"} 40`,
			`kpar_client_connects_total`, // franz-go's kprom
			`go_goroutines`,
			`process_open_fds`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("GET /metrics lacks %q", want)
			}
		}
		s := f.apiStatus(t)
		if !s.Ready || s.Readiness != "4 partitions assigned in group g" {
			t.Errorf("GET /api/status: ready %v %q, want true \"4 partitions assigned in group g\"", s.Ready, s.Readiness)
		}
		if s.Backlog != 0 || s.ConcurrencyLimit < 1 || s.RateLimit != (rateStatus{}) {
			t.Errorf("GET /api/status: backlog %d, concurrency limit %d, rate limit %+v; want 0, 1 or more, off",
				s.Backlog, s.ConcurrencyLimit, s.RateLimit)
		}
		var hwm int64
		for i, p := range s.Partitions {
			if p.Topic != "t" || p.Partition != int32(i) || p.Committed != p.HighWatermark || p.Start != p.End || p.InFlight != 0 {
				t.Errorf("partition %d = %+v, want topic t, partition %d, all committed, none in flight", i, p, i)
			}
			hwm += p.HighWatermark
		}
		if hwm != records {
			t.Errorf("high watermarks add up to %d, want %d", hwm, records)
		}
		if code, _ := f.get(t, "/nope"); code != http.StatusNotFound {
			t.Errorf("GET /nope = %d, want 404", code)
		}
		code, body = f.get(t, "/")
		if code != http.StatusOK || !strings.Contains(body, `<tbody id="partitions">`) || strings.Contains(body, "http://") || strings.Contains(body, "https://") {
			t.Errorf("GET / = %d, want 200 and a page that loads nothing from elsewhere", code)
		}
	})

	t.Run("after ctx ends", func(t *testing.T) {
		f.stop()
		f.waitFor(t, "the server to stop", func() bool {
			resp, err := f.client.Get(f.base + "/healthz")
			if err == nil {
				resp.Body.Close()
			}
			return err != nil
		})
	})
}

func TestServeStatusListenAddress(t *testing.T) {
	for _, tc := range []struct {
		addr, want, err string
	}{
		{"", "127.0.0.1:9464", ""},
		{"127.0.0.1:0", "127.0.0.1:0", ""},
		{"localhost:9464", "localhost:9464", ""},
		{"[::1]:9464", "[::1]:9464", ""},
		{"0.0.0.0:9464", "0.0.0.0:9464", ""}, // named: the user asked for every interface
		{":9464", "", "has no host"},
		{"9464", "", "want host:port"},
	} {
		got, err := statusListenAddr(tc.addr)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("statusListenAddr(%q) = %q, %v; want %q", tc.addr, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("statusListenAddr(%q) = %q, %v; want an error containing %q", tc.addr, got, err, tc.err)
		}
	}
}

func TestServeStatusRejectsBadSetups(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	m := kparprom.New()
	cons, err := kpar.New(kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		kpar.Brokers("127.0.0.1:1"), kpar.Group("g"), kpar.Topics("t"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	if _, err := serveStatus(ctx, ":0", cons, m, nil); err == nil {
		t.Error("serveStatus(\":0\") succeeded, want an error: an empty host listens on every interface")
	}
	if _, err := serveStatus(ctx, "127.0.0.1:0", cons, nil, nil); err == nil {
		t.Error("serveStatus with nil Metrics succeeded, want an error")
	}
	dup := prometheus.NewGauge(prometheus.GaugeOpts{Name: "go_goroutines", Help: "clashes with the Go collector"})
	if _, err := serveStatus(ctx, "127.0.0.1:0", cons, m, nil, dup); err == nil {
		t.Error("serveStatus with a clashing extra collector succeeded, want an error")
	}
	addr, err := serveStatus(ctx, "127.0.0.1:0", cons, m, nil, prometheus.NewGauge(prometheus.GaugeOpts{Name: "extra_gauge", Help: "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serveStatus(ctx, addr, cons, m, nil); err == nil {
		t.Errorf("serveStatus on %s, already in use, succeeded; want an error", addr)
	}
}

// statusSink is a dead-letter sink that keeps nothing.
type statusSink struct{}

func (statusSink) Write(context.Context, []deadletter.Letter) error { return nil }

// TestServeStatusPageInChromium loads the live page in a real headless
// Chromium while records are in flight, one is stuck and some were
// dead-lettered, and checks that its script fetched /api/status and drew a
// row per partition and per dead letter.
func TestServeStatusPageInChromium(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Skipf("%s not found: install Debian's chromium (apt-get install chromium) to test the live page in a browser", chromiumPath)
	}
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	f := newStatusFixture(t, 4, 40, func(ctx context.Context, r *kgo.Record) error {
		switch {
		case r.Offset == 4:
			return kpar.Permanent(errors.New("cannot parse <b>this</b> record"))
		case r.Offset%2 == 1: // half the records hold the window open
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}, kpar.DeadLetters(statusSink{}), kpar.StuckAfter(100*time.Millisecond))
	f.run(t)
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the consumer stops
	f.waitFor(t, "records in flight and stuck on every partition, and a dead letter", func() bool {
		s := f.apiStatus(t)
		n := 0
		for _, p := range s.Partitions {
			if p.InFlight > 0 && p.StuckOffset == 1 {
				n++
			}
		}
		return n == 4 && len(s.DeadLetters) > 0
	})
	dls := len(f.apiStatus(t).DeadLetters)

	dom := chromium(t, "--dump-dom", f.base+"/")
	if !strings.Contains(dom, `data-loaded="true"`) {
		t.Fatalf("the page's script never rendered /api/status; DOM:\n%s", dom)
	}
	rows := regexp.MustCompile(`<tr data-topic="t" data-partition="(\d+)"`).FindAllStringSubmatch(dom, -1)
	if len(rows) != 4 {
		t.Fatalf("page shows %d partition rows, want 4; DOM:\n%s", len(rows), dom)
	}
	for i, r := range rows {
		if r[1] != fmt.Sprint(i) {
			t.Errorf("row %d is partition %s, want %d", i, r[1], i)
		}
	}
	if got := strings.Count(dom, `<tr data-dead-letter="t/`); got != dls {
		t.Errorf("page shows %d dead-letter rows, want %d", got, dls)
	}
	for _, want := range []string{`class="seg-run"`, `class="seg-done"`, `class="badge ok">ready<`, "stuck at 1 for",
		"<span>concurrency limit ", "<span>rate limit off</span>", " records</span>", ">Backlog</th>",
		"cannot parse &lt;b&gt;this&lt;/b&gt; record"} { // error text shown as text, not markup
		if !strings.Contains(dom, want) {
			t.Errorf("page lacks %q; DOM:\n%s", want, dom)
		}
	}

	// A screenshot for a person to look at: kept out of the repo, in
	// $KPAR_TEST_ARTIFACTS when set, else in the test's temporary directory.
	dir := os.Getenv("KPAR_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	png := filepath.Join(dir, "status-page.png")
	chromium(t, "--window-size=1280,800", "--screenshot="+png, f.base+"/")
	if b, err := os.ReadFile(png); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("screenshot %s: %v (want a PNG)", png, err)
	} else {
		t.Logf("screenshot of the live page: %s", png)
	}
}

// chromium runs headless Chromium with args after letting the page's
// script run for 3s of virtual time, and returns its standard output.
func chromium(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--user-data-dir=" + t.TempDir(), "--virtual-time-budget=3000",
	}
	cmd := exec.CommandContext(ctx, chromiumPath, append(base, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Chromium forks helpers: run it in a process group of its own and end
	// the whole group, on timeout and after it exits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // stray helpers, if any
	}
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("chromium %v: no result within 90s; stderr:\n%s", args, stderr.String())
		}
		t.Fatalf("chromium %v: %v; stderr:\n%s", args, err, stderr.String())
	}
	return stdout.String()
}
