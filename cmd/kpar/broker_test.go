package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

// TestMain removes the kpar binary that buildKpar shares across the tests of
// this package. It lives here because buildKpar does; a package has one
// TestMain, so other test files add to this one rather than define theirs.
func TestMain(m *testing.M) {
	code := m.Run()
	if kparBuild.dir != "" {
		os.RemoveAll(kparBuild.dir)
	}
	os.Exit(code)
}

// kparBuild is the binary built by buildKpar, once per test binary run.
var kparBuild struct {
	once sync.Once
	dir  string // removed by TestMain
	bin  string
	err  error
}

// buildKpar builds the kpar command once for the whole test binary and
// returns the path of the executable, for end-to-end tests that run kpar as
// a user would.
func buildKpar(t *testing.T) string {
	t.Helper()
	kparBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "kpar-test-bin-")
		if err != nil {
			kparBuild.err = err
			return
		}
		kparBuild.dir = dir
		bin := filepath.Join(dir, "kpar")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// The test runs in cmd/kpar, so "." is ./cmd/kpar.
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			kparBuild.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		kparBuild.bin = bin
	})
	if kparBuild.err != nil {
		t.Fatalf("building kpar: %v", kparBuild.err)
	}
	return kparBuild.bin
}

// lineWriter collects a command's output and reports its first line, so a
// test can wait for "listening" without polling or sleeping.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer // guarded by mu
	sent  bool         // guarded by mu
	first chan string  // receives the first complete line, once
}

func newLineWriter() *lineWriter { return &lineWriter{first: make(chan string, 1)} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if line, _, ok := strings.Cut(w.buf.String(), "\n"); ok && !w.sent {
		w.sent = true
		w.first <- line
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitListening waits for the broker's "listening" line on stdout and
// returns the address in it.
func waitListening(ctx context.Context, t *testing.T, stdout, stderr *lineWriter, exited <-chan struct{}) string {
	t.Helper()
	select {
	case line := <-stdout.first:
		addr, ok := strings.CutPrefix(line, "kpar broker listening on ")
		if !ok {
			t.Fatalf("first stdout line = %q, want \"kpar broker listening on ADDR\"", line)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil || strings.HasSuffix(addr, ":0") {
			t.Fatalf("listening address %q is not a real host:port", addr)
		}
		return addr
	case <-exited:
		t.Fatalf("broker exited before listening; stderr:\n%s", stderr)
	case <-ctx.Done():
		t.Fatalf("no listening line: %v; stderr:\n%s", ctx.Err(), stderr)
	}
	return ""
}

// startBroker runs cmdBroker in process until stop, which returns its exit
// code.
func startBroker(ctx context.Context, t *testing.T, args ...string) (addr string, stop func() int) {
	t.Helper()
	bctx, cancel := context.WithCancel(ctx)
	stdout, stderr := newLineWriter(), newLineWriter()
	exited := make(chan struct{})
	var code int
	go func() {
		defer close(exited)
		code = cmdBroker(bctx, args, stdout, stderr)
	}()
	stop = func() int {
		cancel()
		select {
		case <-exited:
		case <-ctx.Done():
			t.Fatalf("broker did not stop: %v", ctx.Err())
		}
		if code != 0 {
			t.Logf("broker stderr:\n%s", stderr)
		}
		return code
	}
	t.Cleanup(func() { cancel(); <-exited })
	addr = waitListening(ctx, t, stdout, stderr, exited)
	if got, want := stdout.String(), "kpar broker listening on "+addr+"\n"; got != want {
		t.Errorf("stdout = %q, want exactly %q", got, want)
	}
	return addr, stop
}

// brokerProcess is `kpar broker` run as a separate process.
type brokerProcess struct {
	cmd            *exec.Cmd
	stdout, stderr *lineWriter
	exited         chan struct{}
	waitErr        error // set before exited closes
}

// startBrokerProcess starts the kpar binary's broker command and waits until
// it listens. The process is killed at the end of the test if still running.
func startBrokerProcess(ctx context.Context, t *testing.T, bin string, args ...string) (*brokerProcess, string) {
	t.Helper()
	p := &brokerProcess{
		cmd:    exec.CommandContext(ctx, bin, append([]string{"broker"}, args...)...),
		stdout: newLineWriter(),
		stderr: newLineWriter(),
		exited: make(chan struct{}),
	}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.exited })
	return p, waitListening(ctx, t, p.stdout, p.stderr, p.exited)
}

// signal sends sig and waits for the process to exit, returning Wait's error.
func (p *brokerProcess) signal(ctx context.Context, t *testing.T, sig os.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		return p.waitErr
	case <-ctx.Done():
		t.Fatalf("broker did not exit after %v: %v", sig, ctx.Err())
		return nil
	}
}

func newClient(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(strings.Split(addr, ",")...), // one seed, or KPAR_TEST_BROKERS' list
		kgo.FetchMaxWait(250 * time.Millisecond),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// produce writes key-i/value-i for i in [from, to) to topic, auto-creating it.
func produce(ctx context.Context, t *testing.T, addr, topic string, from, to int) {
	t.Helper()
	cl := newClient(t, addr, kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic(topic))
	defer cl.Close()
	var rs []*kgo.Record
	for i := from; i < to; i++ {
		rs = append(rs, kgo.KeyStringRecord(fmt.Sprintf("key-%d", i), fmt.Sprintf("value-%d", i)))
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// poll reads n records from cl.
func poll(ctx context.Context, t *testing.T, cl *kgo.Client, n int) []*kgo.Record {
	t.Helper()
	var rs []*kgo.Record
	for len(rs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("got %d of %d records: %v", len(rs), n, ctx.Err())
		}
		for _, e := range fs.Errors() {
			t.Fatalf("fetch %s/%d: %v", e.Topic, e.Partition, e.Err)
		}
		rs = append(rs, fs.Records()...)
	}
	if len(rs) > n {
		t.Fatalf("got %d records, want %d", len(rs), n)
	}
	return rs
}

// groupConsume reads n records of topic as a member of group and commits
// them all: the offset committed is the last record's offset + 1.
func groupConsume(ctx context.Context, t *testing.T, addr, group, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := newClient(t, addr,
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	defer cl.Close()
	rs := poll(ctx, t, cl, n)
	if err := cl.CommitRecords(ctx, rs...); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return rs
}

// keyValues returns "key=value" of each record, sorted.
func keyValues(rs []*kgo.Record) []string {
	var kvs []string
	for _, r := range rs {
		kvs = append(kvs, string(r.Key)+"="+string(r.Value))
	}
	slices.Sort(kvs)
	return kvs
}

func wantKeyValues(from, to int) []string {
	var kvs []string
	for i := from; i < to; i++ {
		kvs = append(kvs, fmt.Sprintf("key-%d=value-%d", i, i))
	}
	slices.Sort(kvs)
	return kvs
}

func TestBrokerProducesAndGroupConsumes(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	addr, stop := startBroker(ctx, t, "--listen", "127.0.0.1:0", "--partitions", "3")
	const topic = "orders"
	produce(ctx, t, addr, topic, 0, 10)
	rs := groupConsume(ctx, t, addr, "g", topic, 10)
	if got, want := keyValues(rs), wantKeyValues(0, 10); !slices.Equal(got, want) {
		t.Errorf("consumed %v, want %v", got, want)
	}
	partitions := map[int32]bool{}
	for _, r := range rs {
		partitions[r.Partition] = true
	}
	for p := range partitions {
		if p < 0 || p >= 3 {
			t.Errorf("record in partition %d; --partitions 3 allows 0 to 2", p)
		}
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code %d after cancel, want 0", code)
	}
}

// checkDataDirSurvives produces five records, commits the first three as a
// group, stops the broker with stop and restarts it on the same data
// directory with start: all five records and the committed offset must be
// back, and the broker must keep appending after them.
func checkDataDirSurvives(ctx context.Context, t *testing.T, start func() (addr string, stop func())) {
	t.Helper()
	const topic, group = "events", "survivor"
	addr, stop := start()
	produce(ctx, t, addr, topic, 0, 5)
	cl := newClient(t, addr,
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	rs := poll(ctx, t, cl, 5)
	slices.SortFunc(rs, func(a, b *kgo.Record) int { return int(a.Offset - b.Offset) })
	if err := cl.CommitRecords(ctx, rs[2]); err != nil { // commits offset 3
		t.Fatalf("commit: %v", err)
	}
	cl.Close()
	stop()

	addr, stop = start()
	defer stop()
	all := newClient(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	got := keyValues(poll(ctx, t, all, 5))
	all.Close()
	if want := wantKeyValues(0, 5); !slices.Equal(got, want) {
		t.Errorf("records after restart %v, want %v", got, want)
	}
	produce(ctx, t, addr, topic, 5, 6)
	resumed := groupConsume(ctx, t, addr, group, topic, 3)
	var offsets []int64
	for _, r := range resumed {
		offsets = append(offsets, r.Offset)
	}
	slices.Sort(offsets)
	if want := []int64{3, 4, 5}; !slices.Equal(offsets, want) {
		t.Errorf("group resumed at offsets %v, want %v (committed offset 3 kept)", offsets, want)
	}
}

func TestBrokerDataDirSurvivesCleanStop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	checkDataDirSurvives(ctx, t, func() (string, func()) {
		addr, stop := startBroker(ctx, t, "--listen", "127.0.0.1:0", "--partitions", "1", "--data-dir", dir)
		return addr, func() {
			if code := stop(); code != 0 {
				t.Errorf("exit code %d after cancel, want 0", code)
			}
		}
	})
}

// A kill -9 skips kfake's shutdown save, so this checks what it writes as
// it goes: segments, groups.log and, through embedded, auto-created topics.
func TestBrokerDataDirSurvivesKill(t *testing.T) {
	t.Parallel()
	bin := buildKpar(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	killed := false
	checkDataDirSurvives(ctx, t, func() (string, func()) {
		p, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1", "--data-dir", dir)
		sig := os.Signal(syscall.SIGTERM)
		if !killed {
			killed, sig = true, syscall.SIGKILL
		}
		return addr, func() {
			err := p.signal(ctx, t, sig)
			if sig == syscall.SIGTERM && err != nil {
				t.Errorf("broker after SIGTERM: %v, want exit 0; stderr:\n%s", err, p.stderr)
			}
		}
	})
}

func TestBrokerWithKcat(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Skip("kcat is not on PATH; install it (Debian: apt-get install kcat) to run this test")
	}
	bin := buildKpar(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	p, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "4")

	const topic, group = "kcat-orders", "kcat-group"
	runKcat := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, kcat, append([]string{"-b", addr}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("kcat %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String()
	}
	lines := func(s string) []string {
		l := strings.Fields(s)
		slices.Sort(l)
		return l
	}

	runKcat("k1:v1\nk2:v2\nk3:v3\n", "-P", "-t", topic, "-K:")
	// -o beginning would override the group's committed offsets, so a new
	// group starts at the beginning through auto.offset.reset instead.
	consume := []string{"-G", group, "-X", "auto.offset.reset=earliest", "-e", "-q", "-f", `%k=%s\n`, topic}
	if got, want := lines(runKcat("", consume...)), []string{"k1=v1", "k2=v2", "k3=v3"}; !slices.Equal(got, want) {
		t.Errorf("kcat group consume = %q, want %q", got, want)
	}
	runKcat("k4:v4\n", "-P", "-t", topic, "-K:")
	if got, want := lines(runKcat("", consume...)), []string{"k4=v4"}; !slices.Equal(got, want) {
		t.Errorf("kcat group consume after the commit = %q, want only the new record %q", got, want)
	}

	if err := p.signal(ctx, t, syscall.SIGTERM); err != nil {
		t.Errorf("broker after SIGTERM: %v, want exit 0; stderr:\n%s", err, p.stderr)
	}
	if got, want := p.stdout.String(), "kpar broker listening on "+addr+"\n"; got != want {
		t.Errorf("stdout = %q, want exactly %q", got, want)
	}
}

func TestBrokerRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		flag string // the flag the error must name
	}{
		{"zero partitions", []string{"--partitions", "0"}, nil, "--partitions"},
		{"negative partitions", []string{"--partitions", "-3"}, nil, "--partitions"},
		{"partitions from env", nil, map[string]string{"KPAR_PARTITIONS": "0"}, "--partitions"},
		{"any interface", []string{"--listen", "0.0.0.0:9092"}, nil, "--listen"},
		{"no host", []string{"--listen", ":9092"}, nil, "--listen"},
		{"public host", []string{"--listen", "example.com:9092"}, nil, "--listen"},
		{"no port", []string{"--listen", "127.0.0.1"}, nil, "--listen"},
		{"port out of range", []string{"--listen", "127.0.0.1:65536"}, nil, "--listen"},
		{"listen from env", nil, map[string]string{"KPAR_LISTEN": "10.0.0.1:9092"}, "--listen"},
		{"extra argument", []string{"--listen", "127.0.0.1:0", "now"}, nil, `"now"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := cmdBroker(t.Context(), tc.args, &stdout, &stderr)
			if code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") || !strings.Contains(msg, tc.flag) {
				t.Errorf("stderr = %q, want one line naming %s", msg, tc.flag)
			}
		})
	}

	t.Run("unparsable value", func(t *testing.T) {
		var stderr bytes.Buffer
		if code := cmdBroker(t.Context(), []string{"--partitions", "many"}, new(bytes.Buffer), &stderr); code != 2 {
			t.Errorf("exit code %d, want 2", code)
		}
		// The flag package prints the usage before the error line.
		msg := strings.TrimSuffix(stderr.String(), "\n")
		if last := msg[strings.LastIndex(msg, "\n")+1:]; !strings.Contains(last, "-partitions") {
			t.Errorf("last stderr line = %q, want it to name -partitions", last)
		}
	})

	t.Run("help", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := cmdBroker(t.Context(), []string{"--help"}, &stdout, &stderr); code != 0 {
			t.Errorf("exit code %d, want 0", code)
		}
		for _, f := range []string{"-listen", "-partitions", "-data-dir"} {
			if !strings.Contains(stderr.String(), f) {
				t.Errorf("usage does not mention %s:\n%s", f, stderr.String())
			}
		}
	})
}

// A port already in use is not bad usage but a failure to run: exit 1.
func TestBrokerPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stdout, stderr bytes.Buffer
	if code := cmdBroker(t.Context(), []string{"--listen", ln.Addr().String()}, &stdout, &stderr); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if msg := stderr.String(); strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "address already in use") {
		t.Errorf("stderr = %q, want one line saying the address is in use", msg)
	}
	if stdout.Len() > 0 {
		t.Errorf("stdout = %q, want nothing", stdout.String())
	}
}
