package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/internal/testkit"
)

// ---- the HTTP endpoint the forwarder posts to ----

// reply is what the endpoint does with one attempt of one record.
type reply struct {
	status     int           // response status; 0 means 200
	retryAfter string        // Retry-After header value, if any
	delay      time.Duration // answer this late (a slow endpoint)
	hang       bool          // never answer: wait for the client to give up
}

// delivery is a record's first successful delivery, as the endpoint saw it.
type delivery struct {
	index     int // the record's number, from its value
	key       string
	partition int32
	offset    int64
}

// endpoint is an HTTP server standing in for the service kpar forwards
// to. Each record's value is its decimal index; behave decides, per index
// and attempt (from 1), how the endpoint answers.
type endpoint struct {
	srv    *httptest.Server
	behave func(index, attempt int) reply

	changes   // mu guards the fields below
	attempts  map[int][]time.Time
	ok        map[int]int // 2xx answers per index
	first     []delivery  // first 2xx per index, in order
	cancelled int         // requests whose client went away before the answer
	bad       []string    // malformed requests
}

func newEndpoint(t *testing.T, behave func(index, attempt int) reply) *endpoint {
	t.Helper()
	e := &endpoint{
		behave:   behave,
		attempts: make(map[int][]time.Time),
		ok:       make(map[int]int),
	}
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.srv.Close)
	return e
}

// newGatedEndpoint is newEndpoint answering as behave says until open is
// called, and 2xx from then on.
func newGatedEndpoint(t *testing.T, behave func(index, attempt int) reply) (ep *endpoint, open func()) {
	t.Helper()
	gate := make(chan struct{})
	ep = newEndpoint(t, func(i, attempt int) reply {
		select {
		case <-gate:
			return reply{}
		default:
		}
		return behave(i, attempt)
	})
	return ep, func() { close(gate) }
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	i, err := strconv.Atoi(string(body))
	key, kerr := base64.StdEncoding.DecodeString(r.Header.Get(forward.HeaderKey))
	part, perr := strconv.ParseInt(r.Header.Get(forward.HeaderPartition), 10, 32)
	off, oerr := strconv.ParseInt(r.Header.Get(forward.HeaderOffset), 10, 64)
	_, terr := time.Parse(time.RFC3339, r.Header.Get(forward.HeaderTimestamp))
	hdr, _ := base64.StdEncoding.DecodeString(r.Header.Get(forward.HeaderPrefix + "source"))
	if err := errors.Join(err, kerr, perr, oerr, terr); err != nil || r.Method != http.MethodPost || string(hdr) != "e2e" {
		e.mu.Lock()
		e.bad = append(e.bad, fmt.Sprintf("%s %q %v: %v", r.Method, body, r.Header, err))
		e.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	}

	e.mu.Lock()
	e.attempts[i] = append(e.attempts[i], time.Now())
	attempt := len(e.attempts[i])
	e.mu.Unlock()

	rp := e.behave(i, attempt)
	if rp.hang {
		<-r.Context().Done()
		e.note(func() { e.cancelled++ })
		return
	}
	if rp.delay > 0 {
		select {
		case <-time.After(rp.delay):
		case <-r.Context().Done():
			e.note(func() { e.cancelled++ })
			return
		}
	}
	if rp.status == 0 {
		rp.status = http.StatusOK
	}
	if rp.status/100 == 2 {
		// Noted before answering: the forwarder cannot start the next
		// record of this key before it reads this answer.
		e.note(func() {
			if e.ok[i] == 0 {
				e.first = append(e.first, delivery{i, string(key), int32(part), off})
			}
			e.ok[i]++
		})
	}
	if rp.retryAfter != "" {
		w.Header().Set("Retry-After", rp.retryAfter)
	}
	w.WriteHeader(rp.status)
	fmt.Fprintf(w, "record %d attempt %d: status %d\n", i, attempt, rp.status)
}

// waitFor waits until cond, called with the lock held, is true. It fails the
// test when ctx ends or the forwarder exits first.
func (e *endpoint) waitFor(ctx context.Context, t *testing.T, p *process, what string, cond func() bool) {
	t.Helper()
	if e.await(ctx, p.exited, cond) {
		return
	}
	if ctx.Err() == nil {
		t.Fatalf("kpar forward exited (%v) before %s; stderr:\n%s", p.waitErr, what, tail(p.stderr))
	}
	e.mu.Lock()
	n := e.delivered()
	e.mu.Unlock()
	t.Fatalf("waiting for %s: %v (%d records delivered so far); kpar forward stderr:\n%s", what, ctx.Err(), n, tail(p.stderr))
}

// delivered counts the indexes answered 2xx at least once. Lock held.
func (e *endpoint) delivered() int { return len(e.ok) }

// ---- processes ----

// process is a kpar command run from the built binary.
type process struct {
	cmd     *exec.Cmd
	stderr  *watchWriter
	exited  chan struct{}
	waitErr error // set before exited closes
}

// e2e is how an end-to-end test starts (after t.Parallel): it builds
// kpar and bounds the test to d.
func e2e(t *testing.T, d time.Duration) (bin string, ctx context.Context) {
	t.Helper()
	bin = buildKpar(t)
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return bin, ctx
}

// startForward runs `kpar forward args...` with extra environment entries.
// The process is killed at the end of the test if still running.
func startForward(ctx context.Context, t *testing.T, bin string, env []string, args ...string) *process {
	t.Helper()
	return startCommand(ctx, t, bin, "forward", env, io.Discard, args...)
}

// startCommand runs `kpar command args...` with extra environment entries
// and stdout; its stderr is watched. The process is killed at the end of
// the test if still running.
func startCommand(ctx context.Context, t *testing.T, bin, command string, env []string, stdout io.Writer, args ...string) *process {
	t.Helper()
	p := &process{
		cmd:    exec.CommandContext(ctx, bin, append([]string{command}, args...)...),
		stderr: newWatchWriter(),
		exited: make(chan struct{}),
	}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = stdout, p.stderr
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.exited })
	return p
}

// stop sends sig and waits for the exit, returning the exit code.
func (p *process) stop(ctx context.Context, t *testing.T, sig os.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	return p.wait(ctx, t)
}

// wait waits for the process to exit and returns its exit code (-1 for a
// signal).
func (p *process) wait(ctx context.Context, t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-ctx.Done():
		t.Fatalf("kpar forward did not exit: %v; stderr:\n%s", ctx.Err(), tail(p.stderr))
	}
	return p.cmd.ProcessState.ExitCode()
}

// ---- Kafka helpers ----

// produceIndexed writes records with values "0".."n-1", keys "k<i mod
// keys>" and a "source: e2e" header, and waits for all acknowledgements.
func produceIndexed(ctx context.Context, t *testing.T, topic string, n, keys int, opts ...kgo.Opt) {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic(topic)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rs := make([]*kgo.Record, n)
	for i := range n {
		rs[i] = &kgo.Record{
			Key:     fmt.Appendf(nil, "k%02d", i%keys),
			Value:   []byte(strconv.Itoa(i)),
			Headers: []kgo.RecordHeader{{Key: "source", Value: []byte("e2e")}},
		}
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// readAll reads topic from the start until it has n records, then checks
// that the topic holds no more than that.
func readAll(ctx context.Context, t *testing.T, addr, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := newClient(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	var rs []*kgo.Record
	for len(rs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%s: read %d of %d records: %v", topic, len(rs), n, ctx.Err())
		}
		fs.EachError(func(tp string, p int32, err error) {
			if !errors.Is(err, kerr.UnknownTopicOrPartition) {
				t.Fatalf("fetch %s/%d: %v", tp, p, err)
			}
		})
		rs = append(rs, fs.Records()...)
	}
	var total int64
	for p, end := range endOffsets(ctx, t, addr, topic) {
		if end < 0 {
			t.Fatalf("%s/%d: no end offset", topic, p)
		}
		total += end
	}
	if total != int64(n) {
		t.Errorf("%s holds %d records, want %d", topic, total, n)
	}
	return rs
}

func endOffsets(ctx context.Context, t *testing.T, addr, topic string) map[int32]int64 {
	t.Helper()
	cl := newClient(t, addr)
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("listing end offsets of %s: %v", topic, err)
	}
	out := make(map[int32]int64)
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// checkCommittedAtEnd checks that group committed, for every partition of
// topic, the partition's end: everything was finished and committed.
func checkCommittedAtEnd(ctx context.Context, t *testing.T, addr, group, topic string) {
	t.Helper()
	cl := newClient(t, addr)
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		t.Fatalf("fetching the offsets of group %s: %v", group, err)
	}
	for p, end := range endOffsets(ctx, t, addr, topic) {
		o, ok := offs.Lookup(topic, p)
		switch {
		case end == 0:
		case !ok:
			t.Errorf("%s/%d: nothing committed, want %d", topic, p, end)
		case o.At != end:
			t.Errorf("%s/%d: committed %d, want the end offset %d", topic, p, o.At, end)
		}
	}
}

// checkKeyOrder checks that for each key the first successful deliveries
// came in offset order (dead-lettered records never succeed, so they are
// simply absent).
func checkKeyOrder(t *testing.T, first []delivery) {
	t.Helper()
	last := make(map[string]delivery)
	for _, d := range first {
		if prev, ok := last[d.key]; ok && (prev.partition != d.partition || prev.offset > d.offset) {
			t.Errorf("key %s: record %d (partition %d offset %d) first succeeded after record %d (partition %d offset %d)",
				d.key, d.index, d.partition, d.offset, prev.index, prev.partition, prev.offset)
		}
		last[d.key] = d
	}
}

// ---- end-to-end tests ----

// The endpoint's behaviour per record index in TestForwardDeliversOrDeadLetters.
func mixedBehaviour(i, attempt int) reply {
	switch {
	case i%10 == 3: // rejected: dead-lettered at once, class permanent
		return reply{status: http.StatusBadRequest}
	case i%25 == 9: // always failing: dead-lettered after 3 attempts, class exhausted
		return reply{status: http.StatusInternalServerError}
	case i%10 == 5 && attempt == 1: // fails once
		return reply{status: http.StatusBadGateway}
	case i%100 == 7 && attempt == 1: // busy once, asks for 1s (rare: its key waits)
		return reply{status: http.StatusTooManyRequests, retryAfter: "1"}
	case i%50 == 2 && attempt == 1: // hangs past --attempt-timeout once
		return reply{hang: true}
	case i%10 == 1: // slow
		return reply{delay: 100 * time.Millisecond}
	}
	return reply{}
}

func TestForwardDeliversOrDeadLetters(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "4")

	const topic, group, n, keys = "orders", "forwarder", 300, 20
	var rejected, exhausted []int
	for i := range n {
		switch {
		case i%10 == 3:
			rejected = append(rejected, i)
		case i%25 == 9:
			exhausted = append(exhausted, i)
		}
	}
	produceIndexed(ctx, t, topic, n, keys, kgo.SeedBrokers(addr))
	ep := newEndpoint(t, mixedBehaviour)

	p := startForward(ctx, t, bin, []string{"KPAR_GROUP=" + group}, // env and flags mix
		"--brokers", addr, "--topic", topic, "--url", ep.srv.URL+"/records",
		"--concurrency", "16", "--max-attempts", "3", "--retry-backoff", "20ms",
		"--retry-backoff-max", "200ms", "--attempt-timeout", "1s")
	want := n - len(rejected) - len(exhausted)
	ep.waitFor(ctx, t, p, fmt.Sprintf("%d records delivered", want), func() bool { return ep.delivered() >= want })

	// The dead letters: exactly the rejected and the exhausted records.
	dlq := readAll(ctx, t, addr, topic+".dlq", len(rejected)+len(exhausted))
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	checkCommittedAtEnd(ctx, t, addr, group, topic)

	ep.mu.Lock()
	defer ep.mu.Unlock()
	if len(ep.bad) > 0 {
		t.Errorf("malformed requests: %q", ep.bad)
	}
	for i := range n {
		isDead := slices.Contains(rejected, i) || slices.Contains(exhausted, i)
		if got := ep.ok[i] > 0; got == isDead {
			t.Errorf("record %d: delivered %v, dead-lettered %v: want exactly one", i, got, isDead)
		}
	}
	checkKeyOrder(t, ep.first)

	byIndex := make(map[int]deadletter.Letter)
	for _, r := range dlq {
		l := deadletter.FromRecord(r)
		i, err := strconv.Atoi(string(l.Record.Value))
		if err != nil {
			t.Fatalf("dead letter with value %q", l.Record.Value)
		}
		if _, dup := byIndex[i]; dup {
			t.Errorf("record %d dead-lettered twice", i)
		}
		byIndex[i] = l
		if got := headerValue(r, deadletter.HeaderTopic); got != topic {
			t.Errorf("record %d: %s = %q, want %q", i, deadletter.HeaderTopic, got, topic)
		}
		if l.Group != group {
			t.Errorf("record %d: dead letter group %q, want %q", i, l.Group, group)
		}
		if want := fmt.Sprintf("k%02d", i%keys); string(l.Record.Key) != want {
			t.Errorf("record %d: dead letter key %q, want %q", i, l.Record.Key, want)
		}
		if got := headerValue(r, "source"); got != "e2e" {
			t.Errorf("record %d: original header source = %q, want it kept", i, got)
		}
	}
	for _, i := range rejected {
		l, ok := byIndex[i]
		if !ok {
			t.Errorf("rejected record %d is not in the dead-letter topic", i)
			continue
		}
		if l.Class != deadletter.ClassPermanent || l.Attempts != 1 || !strings.Contains(l.Message, "400") {
			t.Errorf("rejected record %d: class %s, attempts %d, message %q; want permanent, 1, a 400",
				i, l.Class, l.Attempts, l.Message)
		}
		if a := ep.attempts[i]; len(a) != 1 {
			t.Errorf("rejected record %d was tried %d times, want once", i, len(a))
		}
	}
	for _, i := range exhausted {
		l, ok := byIndex[i]
		if !ok {
			t.Errorf("failing record %d is not in the dead-letter topic", i)
			continue
		}
		if l.Class != deadletter.ClassExhausted || l.Attempts != 3 || !strings.Contains(l.Message, "500") {
			t.Errorf("failing record %d: class %s, attempts %d, message %q; want exhausted, 3, a 500",
				i, l.Class, l.Attempts, l.Message)
		}
	}
	for i := 7; i < n; i += 100 {
		if a := ep.attempts[i]; len(a) < 2 || a[1].Sub(a[0]) < time.Second {
			t.Errorf("record %d got 429 with Retry-After: 1; its attempts came at %v, want the second 1s or more after the first", i, a)
		}
	}
	if ep.cancelled == 0 {
		t.Errorf("no request was given up on, want the hanging ones cut at --attempt-timeout")
	}
}

func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestForwardSIGTERMDrainsInFlightRequests stops the forwarder while the
// endpoint holds requests: they must complete (not be cut), their offsets
// must be committed, and the exit code must be 0.
func TestForwardSIGTERMDrainsInFlightRequests(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "4")

	const topic, group, n = "drain", "drainer", 100
	produceIndexed(ctx, t, topic, n, 10, kgo.SeedBrokers(addr))
	release := make(chan struct{})
	held := make(chan struct{}, 4*n)
	ep := newEndpoint(t, func(i, attempt int) reply {
		held <- struct{}{}
		<-release
		return reply{}
	})
	p := startForward(ctx, t, bin, nil,
		"--brokers", addr, "--group", group, "--topic", topic, "--url", ep.srv.URL,
		"--concurrency", "8", "--shutdown-timeout", "1m")
	for range 8 { // one per worker: all of them are in a request
		select {
		case <-held:
		case <-p.exited:
			t.Fatalf("kpar forward exited early: %v; stderr:\n%s", p.waitErr, tail(p.stderr))
		case <-ctx.Done():
			t.Fatalf("requests did not arrive: %v; stderr:\n%s", ctx.Err(), tail(p.stderr))
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Once it logged the signal, let the held requests finish: had the
	// process not waited for them, their clients would be gone by now and
	// the endpoint would count them as cut.
	if !p.stderr.wait(ctx, "stopping", p.exited) {
		t.Fatalf("kpar forward did not log that it is stopping; stderr:\n%s", tail(p.stderr))
	}
	close(release)
	if code := p.wait(ctx, t); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	ep.mu.Lock()
	cancelled, delivered := ep.cancelled, ep.delivered()
	first := slices.Clone(ep.first)
	ep.mu.Unlock()
	if cancelled > 0 {
		t.Errorf("%d requests were cut by the shutdown, want none", cancelled)
	}
	if delivered < 8 {
		t.Errorf("%d records delivered, want at least the 8 in flight", delivered)
	}
	// Everything delivered is committed; what was not delivered is not:
	// the committed offset of each partition is exactly where the delivered
	// records of that partition stop being contiguous from the start.
	done := make(map[int32]map[int64]bool)
	for _, d := range first {
		if done[d.partition] == nil {
			done[d.partition] = make(map[int64]bool)
		}
		done[d.partition][d.offset] = true
	}
	cl := newClient(t, addr)
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	for part, offsets := range done {
		var next int64
		for offsets[next] {
			next++
		}
		if len(offsets) != int(next) {
			t.Errorf("partition %d: delivered offsets %v are not contiguous from 0", part, offsets)
		}
		o, _ := offs.Lookup(topic, part)
		if o.At != next {
			t.Errorf("partition %d: committed %d, want %d (every delivered record and no other)", part, o.At, next)
		}
	}
}

// TestForwardSIGKILLAndRestartLosesNothing kills the forwarder in the middle
// of the topic and starts it again with the same group: every record is
// still delivered, in key order; the restart resumes from the committed
// offsets (nothing below them is delivered again); and at the end
// everything is committed.
func TestForwardSIGKILLAndRestartLosesNothing(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "4")

	const topic, group, n, keys, before = "crash", "survivor", 300, 30, 150
	produceIndexed(ctx, t, topic, n, keys, kgo.SeedBrokers(addr))
	// Until the kill the endpoint answers the first records of the topic
	// (some slowly) and holds the requests of the others, so the kill
	// happens with requests in flight and records unfinished. Indexes grow
	// with offsets in each partition, so the commit point of a partition
	// stops at its first held record.
	ep, open := newGatedEndpoint(t, func(i, attempt int) reply {
		if i < before {
			return reply{delay: time.Duration(i%3) * 5 * time.Millisecond}
		}
		return reply{hang: true}
	})
	// Held requests keep their workers: more workers (the default 64) than
	// keys (one request in flight per key) leaves workers for the others.
	// The killed member stays in the group until its session times out;
	// the restarted one waits for that, so keep it short.
	args := []string{"--brokers", addr, "--group", group, "--topic", topic, "--url", ep.srv.URL,
		"--session-timeout", "6s"}

	p := startForward(ctx, t, bin, nil, args...)
	ep.waitFor(ctx, t, p, fmt.Sprintf("%d records delivered", before), func() bool { return ep.delivered() >= before })
	// Commits are not observable but through the broker: ask until the
	// commit points reach the held records (the commit interval is 1s).
	waitCommitted(ctx, t, addr, group, topic, before)
	if code := p.stop(ctx, t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit code %d after SIGKILL, want death by signal", code)
	}
	ep.mu.Lock()
	if d := ep.delivered(); d != before {
		t.Errorf("%d records delivered before the kill, want exactly the %d not held", d, before)
	}
	ep.mu.Unlock()
	open()

	p = startForward(ctx, t, bin, nil, args...)
	ep.waitFor(ctx, t, p, "every record delivered", func() bool { return ep.delivered() == n })
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	checkCommittedAtEnd(ctx, t, addr, group, topic)

	ep.mu.Lock()
	defer ep.mu.Unlock()
	checkKeyOrder(t, ep.first)
	for i, c := range ep.ok {
		if c != 1 {
			t.Errorf("record %d delivered %d times, want once: the restart must resume at the committed offsets", i, c)
		}
	}
}

// waitCommitted asks the broker until group's committed offsets over
// topic's partitions add up to want.
func waitCommitted(ctx context.Context, t *testing.T, addr, group, topic string, want int64) {
	t.Helper()
	cl := newClient(t, addr)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var sum int64
	for {
		offs, err := adm.FetchOffsets(ctx, group)
		if err == nil {
			sum = 0
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Topic == topic && o.Err == nil {
					sum += o.At
				}
			})
			if sum == want {
				return
			}
			if sum > want {
				t.Fatalf("group %s committed %d records of %s, more than the %d finished", group, sum, topic, want)
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("group %s committed %d records of %s, want %d: %v", group, sum, topic, want, ctx.Err())
		}
	}
}

// ---- TLS and SASL ----

// selfSigned returns a TLS server config for 127.0.0.1 and the PEM of its
// certificate, which clients use as their CA.
func selfSigned(t *testing.T) (*tls.Config, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kpar test broker"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, certPEM
}

// secureCluster starts a kfake cluster that requires TLS and SASL, with
// user admin / secret for PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, and
// returns its address and the path of its CA file.
func secureCluster(t *testing.T) (addr, caFile string) {
	t.Helper()
	srvTLS, caPEM := selfSigned(t)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	c := testkit.Cluster(t,
		kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "admin", "secret"),
		kfake.Superuser("SCRAM-SHA-256", "admin", "secret"),
		kfake.Superuser("SCRAM-SHA-512", "admin", "secret"),
		kfake.TLS(srvTLS),
		kfake.AllowAutoTopicCreation(),
		kfake.SeedTopics(2, "secure"),
	)
	return c.ListenAddrs()[0], caFile
}

func TestForwardOverTLSAndSASL(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, time.Minute)
	addr, caFile := secureCluster(t)

	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(caPEM)
	const n = 20
	produceIndexed(ctx, t, "secure", n, 5,
		kgo.SeedBrokers(addr),
		kgo.DialTLSConfig(&tls.Config{RootCAs: pool}),
		kgo.SASL(scram.Auth{User: "admin", Pass: "secret"}.AsSha512Mechanism()))
	ep := newEndpoint(t, func(int, int) reply { return reply{} })
	p := startForward(ctx, t, bin, []string{"KPAR_SASL_PASSWORD=secret"},
		"--brokers", addr, "--group", "g", "--topic", "secure", "--url", ep.srv.URL,
		"--tls-ca", caFile, "--sasl-mechanism", "scram-sha-512", "--sasl-user", "admin",
		"--metrics-listen", "127.0.0.1:0")
	ep.waitFor(ctx, t, p, "every record delivered", func() bool { return ep.delivered() == n })

	// --metrics-listen serves the status server; the startup line has its
	// address.
	_, after, _ := strings.Cut(p.stderr.String(), "metrics_listen=")
	status, _, _ := strings.Cut(after, "\n")
	if _, _, err := net.SplitHostPort(status); err != nil {
		t.Fatalf("no metrics_listen address in the startup line; stderr:\n%s", tail(p.stderr))
	}
	for path, want := range map[string]string{
		"/healthz": "ok",
		"/metrics": `kpar_records_handled_total{topic="secure"}`,
	} {
		body := httpGet(ctx, t, "http://"+status+path)
		if !strings.Contains(body, want) {
			t.Errorf("GET %s does not contain %q:\n%s", path, want, body)
		}
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	if strings.Contains(p.stderr.String(), "secret") {
		t.Errorf("the password is in the logs:\n%s", tail(p.stderr))
	}
}

// TestForwardRefusedCredentialsExit checks that credentials or certificates
// the brokers refuse stop the forwarder with a clear reason, quickly,
// rather than leaving it retrying in silence.
func TestForwardRefusedCredentialsExit(t *testing.T) {
	t.Parallel()
	bin := buildKpar(t)
	addr, caFile := secureCluster(t)
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want []string // in the error line
	}{
		{"wrong plain password", []string{"KPAR_SASL_PASSWORD=wrong"},
			[]string{"--tls-ca", caFile, "--sasl-mechanism", "plain", "--sasl-user", "admin"},
			[]string{"PLAIN", "rejected", "--sasl-password"}},
		{"wrong scram-sha-256 password", nil,
			[]string{"--tls-ca", caFile, "--sasl-mechanism", "scram-sha-256", "--sasl-user", "admin", "--sasl-password", "wrong"},
			[]string{"SCRAM-SHA-256", "rejected", "--sasl-password"}},
		{"unknown scram-sha-512 user", []string{"KPAR_SASL_PASSWORD=secret"},
			[]string{"--tls-ca", caFile, "--sasl-mechanism", "scram-sha-512", "--sasl-user", "nobody"},
			[]string{"SCRAM-SHA-512", "rejected", "--sasl-user"}},
		{"untrusted certificate", []string{"KPAR_SASL_PASSWORD=secret"},
			[]string{"--tls", "--sasl-mechanism", "plain", "--sasl-user", "admin"},
			[]string{"not trusted", "--tls-ca"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			start := time.Now()
			p := startForward(ctx, t, bin, tc.env, append([]string{
				"--brokers", addr, "--group", "g", "--topic", "secure", "--url", "http://127.0.0.1:1/"}, tc.args...)...)
			code := p.wait(ctx, t)
			if code != 1 {
				t.Errorf("exit code %d, want 1; stderr:\n%s", code, tail(p.stderr))
			}
			var errLine string
			for _, l := range strings.Split(p.stderr.String(), "\n") {
				if strings.Contains(l, "level=ERROR") {
					errLine = l
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(errLine, w) {
					t.Errorf("error line %q does not mention %q; stderr:\n%s", errLine, w, tail(p.stderr))
				}
			}
			if strings.Contains(p.stderr.String(), "secret") {
				t.Errorf("the password is in the logs:\n%s", tail(p.stderr))
			}
			t.Logf("exited %d after %v: %s", code, time.Since(start).Round(time.Millisecond), errLine)
		})
	}
}

// httpGet returns the body of a 200 response to GET url.
func httpGet(ctx context.Context, t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return string(body)
}

// ---- flags ----

func TestForwardRejectsBadFlags(t *testing.T) {
	base := []string{"--brokers", "127.0.0.1:9092", "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:8080/in"}
	with := func(args ...string) []string { return append(slices.Clone(base), args...) } // a valid command line with args after it: only they are wrong
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		flag string // the error must name it
	}{
		{"no brokers", []string{"--group", "g", "--topic", "t", "--url", "http://x/"}, nil, "--brokers"},
		{"no group", []string{"--brokers", "h:1", "--topic", "t", "--url", "http://x/"}, nil, "--group"},
		{"no topic", []string{"--brokers", "h:1", "--group", "g", "--url", "http://x/"}, nil, "--topic"},
		{"no url", []string{"--brokers", "h:1", "--group", "g", "--topic", "t"}, nil, "--url"},
		{"broker without port", with("--brokers", "localhost"), nil, "--brokers"},
		{"empty broker list", with("--brokers", " , "), nil, "--brokers"},
		{"url scheme", with("--url", "ftp://x/"), nil, "--url"},
		{"url without host", with("--url", "http:///in"), nil, "--url"},
		{"ordering", with("--ordering", "random"), nil, "--ordering"},
		{"ordering from env", base, map[string]string{"KPAR_ORDERING": "random"}, "--ordering"},
		{"concurrency", with("--concurrency", "0"), nil, "--concurrency"},
		{"concurrency from env", base, map[string]string{"KPAR_CONCURRENCY": "lots"}, "--concurrency"},
		{"max attempts", with("--max-attempts", "0"), nil, "--max-attempts"},
		{"retry backoff", with("--retry-backoff", "0s"), nil, "--retry-backoff"},
		{"retry backoff max", with("--retry-backoff", "1s", "--retry-backoff-max", "10ms"), nil, "--retry-backoff-max"},
		{"attempt timeout", with("--attempt-timeout", "-1s"), nil, "--attempt-timeout"},
		{"session timeout", with("--session-timeout", "10ms"), nil, "--session-timeout"},
		{"shutdown timeout", with("--shutdown-timeout", "0s"), nil, "--shutdown-timeout"},
		{"shutdown timeout from env", base, map[string]string{"KPAR_SHUTDOWN_TIMEOUT": "soon"}, "--shutdown-timeout"},
		{"dlq topic is the topic", with("--dlq-topic", "t"), nil, "--dlq-topic"},
		{"metrics on every interface", with("--metrics-listen", ":0"), nil, "--metrics-listen"},
		{"metrics without port", with("--metrics-listen", "127.0.0.1"), nil, "--metrics-listen"},
		{"log level", with("--log-level", "loud"), nil, "--log-level"},
		{"rate limit", with("--rate-limit", "-1"), nil, "--rate-limit"},
		{"rate limit from env", base, map[string]string{"KPAR_RATE_LIMIT": "fast"}, "--rate-limit"},
		{"rate burst without a limit", with("--rate-burst", "5"), nil, "--rate-burst"},
		{"rate burst", with("--rate-limit", "5", "--rate-burst", "-1"), nil, "--rate-burst"},
		{"key rate limit", with("--key-rate-limit", "NaN"), nil, "--key-rate-limit"},
		{"key rate limit from env", base, map[string]string{"KPAR_KEY_RATE_LIMIT": "-2"}, "--key-rate-limit"},
		{"tls cert without key", with("--tls-cert", "c.pem"), nil, "--tls-key"},
		{"sasl mechanism", with("--sasl-mechanism", "gssapi"), nil, "--sasl-mechanism"},
		{"sasl without password", with("--sasl-mechanism", "plain", "--sasl-user", "u"), nil, "--sasl-password"},
		{"extra argument", with("now"), nil, `"now"`},
		{"batch", with("--batch", "0"), nil, "--batch"},
		{"batch from env", base, map[string]string{"KPAR_BATCH": "lots"}, "--batch"},
		{"batch wait", with("--batch", "10", "--batch-wait", "0s"), nil, "--batch-wait"},
		{"topic and regex", with("--topic-regex", "t.*"), nil, "--topic-regex"},
		{"bad regex", []string{"--brokers", "h:1", "--group", "g", "--url", "http://x/", "--topic-regex", "("}, nil, "--topic-regex"},
		{"retry topics", with("--retry-topics", "1s,soon"), nil, "--retry-topics"},
		{"retry topics zero", with("--retry-topics", "0s"), nil, "--retry-topics"},
		{"retry topics with regex", []string{"--brokers", "h:1", "--group", "g", "--url", "http://x/", "--topic-regex", "t.*", "--retry-topics", "1s"}, nil, "--retry-topics"},
		{"dead letters scheme", with("--dead-letters", "s3://bucket"), nil, "--dead-letters"},
		{"dead letters broker", with("--dead-letters", "kafka://nohost/t.dlq"), nil, "--dead-letters"},
		{"dead letters two topics", with("--dead-letters", "kafka://h:1/a,b"), nil, "--dead-letters"},
		{"dead letters no path", with("--dead-letters", "file://"), nil, "--dead-letters"},
		{"dlq topic with a file sink", with("--dead-letters", "file:///tmp/x", "--dlq-topic", "d"), nil, "--dlq-topic"},
		{"dead-letter topic is consumed", with("--dead-letters", "kafka://h:1/t"), nil, "--dlq-topic"},
		{"header without colon", with("--header", "X-Token"), nil, "--header"},
		{"header kpar sets", with("--header", "Kpar-Topic: x"), nil, "--header"},
		{"header from env", base, map[string]string{"KPAR_HEADER": "A: 1\nbad name: 2"}, "--header"},
		{"header file missing", with("--header-file", "/nonexistent/h"), nil, "--header-file"},
		{"url ca missing", with("--url-ca", "/nonexistent/ca.pem"), nil, "--url-ca"},
		{"url ca not pem", with("--url-ca", "forward_test.go"), nil, "--url-ca"},
		{"content type", with("--content-type", "json"), nil, "--content-type"},
		{"content type header twice", with("--header", "Content-Type: a/b", "--header", "content-type: a/b"), nil, "--header"},
		{"content type header and flag disagree", with("--content-type", "application/json", "--header", "Content-Type: text/plain"), nil, "--content-type"},
		{"cloudevents with batch", with("--cloudevents", "--batch", "10"), nil, "--batch"},
		{"ce type without cloudevents", with("--ce-type", "com.example"), nil, "--cloudevents"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := cmdForward(t.Context(), tc.args, &stdout, &stderr)
			if code != 2 {
				t.Errorf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") || !strings.Contains(msg, tc.flag) {
				t.Errorf("stderr = %q, want one line naming %s", msg, tc.flag)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

// A header's value is a secret: a bad one is reported by name only.
func TestForwardBadHeaderDoesNotShowItsValue(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "headers")
	if err := os.WriteFile(file, []byte("# secrets\nAuthorization: Bearer s3cret\nX-Bad\x7f: s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--header", "X-Token: s3cret\x01"},
		{"--header-file", file},
	} {
		var stderr bytes.Buffer
		base := []string{"--brokers", "127.0.0.1:9092", "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:8080/in"}
		if code := cmdForward(t.Context(), append(base, args...), io.Discard, &stderr); code != 2 {
			t.Errorf("%q: exit code %d, want 2", args, code)
		}
		if msg := stderr.String(); strings.Contains(msg, "s3cret") || !strings.Contains(msg, args[0]) {
			t.Errorf("%q: stderr %q, want the flag named and the value hidden", args, msg)
		}
	}
}

func TestForwardHelpListsEveryFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := cmdForward(t.Context(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	for _, f := range []string{
		"-brokers", "-group", "-topic", "-url", "-ordering", "-concurrency", "-max-attempts",
		"-retry-backoff", "-attempt-timeout", "-dlq-topic", "-shutdown-timeout", "-metrics-listen",
		"-tls-ca", "-tls-cert", "-tls-key", "-sasl-mechanism", "-sasl-user", "-sasl-password",
		"(default 64)", "(default 3)", "(default 100ms)", "(default 10s)", "(default 30s)", "(default key)",
		"-batch", "-batch-wait", "(default 5ms)", "-header", "-header-file", "-url-ca", "-retry-topics",
		"-dead-letters", "-topic-regex", "Kpar-Tombstone", "Kpar-Headers", "traceparent",
		"-rate-limit", "-key-rate-limit", "-rate-burst", "-key-rate-burst", "-adaptive",
		"-content-type", `(default "application/octet-stream")`, "the record's own content-type", "docs/http-contract.md",
		"-cloudevents", "-ce-source", "-ce-type", `{"status": 422, "error": "why", "retry_after": seconds}`,
	} {
		if !strings.Contains(stderr.String(), f) {
			t.Errorf("usage does not mention %s:\n%s", f, stderr.String())
		}
	}
}

// A forwarder asked to stop before it reached the brokers exits at once,
// with 1 and the reason (issue 37: it exited 0 without a word): no broker
// was ever reached, so the configuration is wrong.
func TestForwardStopsBeforeConnecting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there
	ctx, cancel := context.WithCancel(t.Context())
	w := newWatchWriter()
	done := make(chan int, 1)
	go func() {
		done <- cmdForward(ctx, []string{"--brokers", addr, "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:1/"}, io.Discard, w)
	}()
	if !w.wait(t.Context(), "kpar forward starting", nil) { // it is trying to connect now
		t.Fatalf("no startup line; stderr:\n%s", w)
	}
	cancel()
	select {
	case code := <-done:
		if code != 1 || !strings.Contains(w.String(), "stopped before it ever reached a broker") {
			t.Errorf("exit code %d, want 1 and the reason; stderr:\n%s", code, w)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("cmdForward did not return after cancel; stderr:\n%s", w)
	}
}

// changes is state a test waits on without polling: mu guards it (and
// the fields of the struct that embeds it); whoever changes it calls
// changedLocked (or note), which wakes the waiters of await.
type changes struct {
	mu      sync.Mutex
	changed chan struct{} // closed at the next change; nil while no one waits
}

// changedLocked wakes the waiters. Called with mu held.
func (c *changes) changedLocked() {
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// note changes the state under the lock and wakes the waiters.
func (c *changes) note(fn func()) {
	c.mu.Lock()
	fn()
	c.changedLocked()
	c.mu.Unlock()
}

// await waits until cond, called with mu held, is true (true), or until
// stop closes or ctx ends (false).
func (c *changes) await(ctx context.Context, stop <-chan struct{}, cond func() bool) bool {
	for {
		c.mu.Lock()
		ok := cond()
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		ch := c.changed
		c.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-stop:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// watchWriter collects output and lets a test wait for what it expects
// without polling.
type watchWriter struct {
	changes
	buf bytes.Buffer // guarded by mu
}

func newWatchWriter() *watchWriter { return &watchWriter{} }

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.changedLocked()
	return w.buf.Write(p)
}

// wait waits until the output contains s, or done or ctx ends first; it
// reports whether s came.
func (w *watchWriter) wait(ctx context.Context, s string, done <-chan struct{}) bool {
	has := func() bool { return strings.Contains(w.buf.String(), s) }
	if w.await(ctx, done, has) {
		return true
	}
	return ctx.Err() == nil && strings.Contains(w.String(), s)
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// tail returns the last 40 lines of a process's stderr, enough to see why
// it failed without drowning the test output in retry warnings.
func tail(w *watchWriter) string {
	lines := strings.Split(strings.TrimRight(w.String(), "\n"), "\n")
	if len(lines) > 40 {
		lines = append([]string{fmt.Sprintf("[... %d lines ...]", len(lines)-40)}, lines[len(lines)-40:]...)
	}
	return strings.Join(lines, "\n")
}

// ---- batches, extra headers, other sinks, trace context ----

// newBatchEndpoint is newEndpoint for --batch: each request is a JSON array
// of records, answered with one status per record from behave. It checks
// that every request carries wantHeader and that no batch holds two
// records of one key and partition; sizes receives every batch's size.
// Records of topic orders keep their index, those of the other topic
// (refunds) are numbered from 1000.
func newBatchEndpoint(t *testing.T, wantHeader http.Header, behave func(index, attempt int) reply) (*endpoint, *[]int) {
	t.Helper()
	e := &endpoint{
		behave:   behave,
		attempts: make(map[int][]time.Time),
		ok:       make(map[int]int),
	}
	var sizes []int
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var items []forward.BatchRecord
		body, _ := io.ReadAll(r.Body)
		err := json.Unmarshal(body, &items)
		for k := range wantHeader {
			if r.Header.Get(k) != wantHeader.Get(k) {
				err = errors.Join(err, fmt.Errorf("header %s = %q", k, r.Header.Get(k)))
			}
		}
		if r.Header.Get("Content-Type") != "application/json" {
			err = errors.Join(err, fmt.Errorf("content type %q", r.Header.Get("Content-Type")))
		}
		lanes := map[string]bool{}
		statuses := make([]int, len(items))
		e.mu.Lock()
		sizes = append(sizes, len(items))
		for j, it := range items {
			v, k := it.Value, it.Key
			// Topics after the first number their records from 1000.
			i, ierr := strconv.Atoi(string(v))
			if it.Topic != "orders" {
				i += 1000
			}
			lane := fmt.Sprintf("%s/%d/%s", it.Topic, it.Partition, k)
			if ierr != nil || lanes[lane] || err != nil {
				e.bad = append(e.bad, fmt.Sprintf("item %+v (lane taken %v): %v %v", it, lanes[lane], ierr, err))
				statuses[j] = http.StatusBadRequest
				continue
			}
			lanes[lane] = true
			e.attempts[i] = append(e.attempts[i], time.Now())
			rp := e.behave(i, len(e.attempts[i]))
			statuses[j] = cmp.Or(rp.status, http.StatusOK)
			if statuses[j]/100 == 2 {
				if e.ok[i] == 0 {
					e.first = append(e.first, delivery{i, it.Topic + "/" + string(k), it.Partition, it.Offset})
				}
				e.ok[i]++
			}
		}
		e.changedLocked()
		e.mu.Unlock()
		json.NewEncoder(w).Encode(statuses)
	}))
	t.Cleanup(e.srv.Close)
	return e, &sizes
}

// TestForwardBatchesToAFileSink runs `kpar forward --batch 10` on two
// topics with extra headers from the environment and a file, and
// dead letters in a file: every record is delivered once or dead-lettered
// once, per-record statuses are honoured, batches hold at most one record
// per key and partition, and each key's records succeed in order.
func TestForwardBatchesToAFileSink(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 20*time.Second)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "3")

	const group, n, keys = "batcher", 200, 12
	for _, topic := range []string{"orders", "refunds"} {
		produceIndexed(ctx, t, topic, n, keys, kgo.SeedBrokers(addr))
	}
	dir := t.TempDir()
	headerFile := filepath.Join(dir, "headers")
	if err := os.WriteFile(headerFile, []byte("# the endpoint's key\nAuthorization: Bearer s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dlqFile := filepath.Join(dir, "dead.jsonl")
	behave := func(i, attempt int) reply {
		i %= 1000 // the same records in both topics
		switch {
		case i%20 == 7:
			return reply{status: http.StatusUnprocessableEntity}
		case i%9 == 4 && attempt == 1:
			return reply{status: http.StatusServiceUnavailable}
		}
		return reply{}
	}
	ep, sizes := newBatchEndpoint(t, http.Header{"X-Api-Key": {"k1"}, "X-Env": {"e2e"}, "Authorization": {"Bearer s3cret"}}, behave)
	t.Cleanup(func() {
		ep.mu.Lock()
		defer ep.mu.Unlock()
		if t.Failed() && len(ep.bad) > 0 {
			t.Logf("first malformed request: %s", ep.bad[0])
		}
	})
	// KPAR_HEADER holds one header per line (a --header flag would
	// replace it, as flags replace their variables).
	p := startForward(ctx, t, bin, []string{"KPAR_HEADER=X-Api-Key: k1\nX-Env: e2e"},
		"--brokers", addr, "--group", group, "--topic", "orders", "--topic", "refunds",
		"--url", ep.srv.URL, "--batch", "10", "--batch-wait", "2ms",
		"--header-file", headerFile,
		"--dead-letters", "file://"+dlqFile, "--retry-backoff", "10ms")
	rejected := 0
	for i := range n {
		if i%20 == 7 {
			rejected++
		}
	}
	ep.waitFor(ctx, t, p, "every good record delivered", func() bool { return ep.delivered() >= 2*(n-rejected) })
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	for _, topic := range []string{"orders", "refunds"} {
		checkCommittedAtEnd(ctx, t, addr, group, topic)
	}
	if strings.Contains(p.stderr.String(), "s3cret") {
		t.Errorf("the log shows a header value:\n%s", tail(p.stderr))
	}

	src, err := deadletter.OpenSource(ctx, "file://"+dlqFile)
	if err != nil {
		t.Fatal(err)
	}
	var letters []deadletter.Letter
	if err := src.Read(ctx, func(l deadletter.Letter) error { letters = append(letters, l); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(letters) != 2*rejected {
		t.Errorf("%d dead letters, want %d", len(letters), 2*rejected)
	}
	for _, l := range letters {
		i, _ := strconv.Atoi(string(l.Record.Value))
		if i%20 != 7 || l.Class != deadletter.ClassPermanent || !strings.Contains(l.Message, "422") {
			t.Errorf("dead letter %d: class %s, message %q; want a permanent 422", i, l.Class, l.Message)
		}
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if len(ep.bad) > 0 {
		t.Errorf("malformed requests: %q", ep.bad)
	}
	for i, c := range ep.ok {
		if c != 1 || i%1000%20 == 7 {
			t.Errorf("record %d answered 2xx %d times, want once, and never for a rejected one", i, c)
		}
	}
	checkKeyOrder(t, ep.first)
	largest := slices.Max(*sizes)
	if largest < 2 || largest > 10 {
		t.Errorf("largest batch %d, want 2 to 10", largest)
	}
}

// TestForwardSendsTraceContextOverPrivateTLS produces a record with W3C
// trace context and a tombstone to a topic found by --topic-regex, and
// forwards them to an https endpoint whose CA is given with --url-ca: the
// request of the first carries the producer's traceparent (same trace ID)
// and tracestate, the second is marked Kpar-Tombstone.
func TestForwardSendsTraceContextOverPrivateTLS(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1")

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	const traceparent = "00-" + traceID + "-00f067aa0ba902b7-01"
	cl := newClient(t, addr, kgo.AllowAutoTopicCreation())
	defer cl.Close()
	err := cl.ProduceSync(ctx,
		&kgo.Record{Topic: "traced.a", Key: []byte("k"), Value: []byte("hello"), Headers: []kgo.RecordHeader{
			{Key: "traceparent", Value: []byte(traceparent)}, {Key: "tracestate", Value: []byte("congo=t61rcWkgMzE")},
		}},
		&kgo.Record{Topic: "traced.a", Key: []byte("k")}, // a tombstone
	).FirstErr()
	if err != nil {
		t.Fatal(err)
	}

	got := make(chan http.Header, 2)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
	}))
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	pemCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, pemCert, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "tracer",
		"--topic-regex", `^traced\.`, "--url", srv.URL, "--url-ca", caFile)
	var hs []http.Header
	for len(hs) < 2 {
		select {
		case h := <-got:
			hs = append(hs, h)
		case <-p.exited:
			t.Fatalf("kpar forward exited: %v; stderr:\n%s", p.waitErr, tail(p.stderr))
		case <-ctx.Done():
			t.Fatalf("%d of 2 requests; stderr:\n%s", len(hs), tail(p.stderr))
		}
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	// One key in one partition: the two arrive in order.
	tp := hs[0].Get("Traceparent")
	if parts := strings.Split(tp, "-"); len(parts) != 4 || parts[1] != traceID {
		t.Errorf("traceparent %q, want trace ID %s", tp, traceID)
	}
	if ts := hs[0].Get("Tracestate"); ts != "congo=t61rcWkgMzE" {
		t.Errorf("tracestate %q", ts)
	}
	if hs[0].Get(forward.HeaderTombstone) != "" || hs[1].Get(forward.HeaderTombstone) != "true" {
		t.Errorf("Kpar-Tombstone %q then %q, want none then true", hs[0].Get(forward.HeaderTombstone), hs[1].Get(forward.HeaderTombstone))
	}
	if hs[1].Get("Traceparent") != "" {
		t.Errorf("the record without trace context was sent with traceparent %q", hs[1].Get("Traceparent"))
	}
}

func TestForwardTopicRegexPassesOverDeadLetterTopics(t *testing.T) {
	var handled []string
	h := kpar.HandlerFunc(func(_ context.Context, r *kgo.Record) error { handled = append(handled, r.Topic); return nil })
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		sink deadLetterSink
		want []string
	}{
		{deadLetterSink{scheme: "kafka"}, []string{"orders", "orders.dlqx", "dead"}},
		{deadLetterSink{scheme: "kafka", topic: "dead"}, []string{"orders", "orders.dlq", "orders.dlqx"}},
		{deadLetterSink{scheme: "file", path: "x"}, []string{"orders", "orders.dlq", "orders.dlqx", "dead"}},
	} {
		handled = nil
		wrapped := skipDeadLetters(h, tc.sink, log)
		for _, topic := range []string{"orders", "orders.dlq", "orders.dlqx", "dead"} {
			if err := wrapped.Handle(t.Context(), &kgo.Record{Topic: topic}); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(handled, tc.want) {
			t.Errorf("sink %+v: forwarded %q, want %q", tc.sink, handled, tc.want)
		}
	}
}

func TestForwardParseDeadLetters(t *testing.T) {
	for raw, want := range map[string]deadLetterSink{
		"":                             {scheme: "kafka"},
		"kafka://h1:9092,h2:9092":      {scheme: "kafka", brokers: []string{"h1:9092", "h2:9092"}},
		"kafka://h1:9092/":             {scheme: "kafka", brokers: []string{"h1:9092"}},
		"kafka://h1:9092/orders.dead":  {scheme: "kafka", brokers: []string{"h1:9092"}, topic: "orders.dead"},
		"file:///var/lib/kpar/d.jsonl": {scheme: "file", path: "/var/lib/kpar/d.jsonl"},
		"file://dead.jsonl":            {scheme: "file", path: "dead.jsonl"},
		"postgres://u:p@db/kpar?sslmode=disable&kpar_table=dl": {scheme: "postgres", dsn: "postgres://u:p@db/kpar?sslmode=disable", table: "dl"},
		"postgresql://db/kpar":                                 {scheme: "postgres", dsn: "postgresql://db/kpar"},
	} {
		got, err := parseDeadLetters(raw)
		if err != nil || fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Errorf("parseDeadLetters(%q) = %+v, %v; want %+v", raw, got, err, want)
		}
	}
	if s, _ := parseDeadLetters("postgres://u:s3cret@db/kpar"); strings.Contains(s.describe(), "s3cret") {
		t.Errorf("describe() = %q shows the password", s.describe())
	}
}

// TestForwardOutageDeadLettersNothing: with the default flags an endpoint
// that is down until records have been tried past --max-attempts
// dead-letters nothing, whether it answers 503 or hangs past
// --attempt-timeout (issue 28: a 20 s hang with --attempt-timeout 2s
// dead-lettered 5 of 20); once it recovers every record is delivered, and
// the log summarises the outage instead of a line per attempt.
func TestForwardOutageDeadLettersNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		down reply    // the answer while down
		args []string // more flags
		past int      // records to see tried more than 3 times
		// spells bounds the "downstream overloaded" lines: one, or with a
		// hang a few (requests still hanging when the endpoint recovers
		// time out after its first answers, a short spell of their own).
		spells int
	}{
		{"503", reply{status: http.StatusServiceUnavailable}, nil, 3, 1},
		{"hang", reply{hang: true}, []string{"--attempt-timeout", "200ms"}, 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin, ctx := e2e(t, 2*time.Minute)
			_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "3")
			const n = 60
			produceIndexed(ctx, t, "orders", n, 6, kgo.SeedBrokers(addr))

			var down atomic.Bool
			down.Store(true)
			var ep *endpoint
			ep = newEndpoint(t, func(i, attempt int) reply {
				if down.Load() {
					ep.note(func() {}) // wake the waiter: it counts attempts
					return tc.down
				}
				return reply{}
			})
			dlq := filepath.Join(t.TempDir(), "dead.jsonl")
			p := startForward(ctx, t, bin, nil, append([]string{"--brokers", addr, "--group", "g", "--topic", "orders",
				"--url", ep.srv.URL, "--dead-letters", "file://" + dlq}, tc.args...)...)
			// Down until records were tried past --max-attempts (3), which
			// before made them dead letters (in key order only the first of
			// each key is tried), and for a second: the breaker opens after
			// 250ms.
			ep.waitFor(ctx, t, p, "records tried more than 3 times, for a second", func() bool {
				past, first := 0, time.Now()
				for _, a := range ep.attempts {
					if len(a) > 3 {
						past++
					}
					if len(a) > 0 && a[0].Before(first) {
						first = a[0]
					}
				}
				return past >= tc.past && time.Since(first) > time.Second
			})
			down.Store(false)
			ep.waitFor(ctx, t, p, "every record delivered after the outage", func() bool { return ep.delivered() == n })
			if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
				t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
			}
			if b, err := os.ReadFile(dlq); err == nil && len(b) > 0 {
				t.Errorf("dead letters written for the outage:\n%s", b)
			}
			log := p.stderr.String()
			attempts := 0
			ep.mu.Lock()
			for _, a := range ep.attempts {
				attempts += len(a)
			}
			ep.mu.Unlock()
			for _, c := range []struct {
				msg      string
				min, max int
			}{
				{"kpar: handler failed", 0, 0},
				{"kpar: downstream overloaded", 1, tc.spells},
				{"kpar: downstream recovered", 1, tc.spells},
			} {
				if got := strings.Count(log, c.msg); got < c.min || got > c.max {
					t.Errorf("%q logged %d times for %d attempts, want %d to %d; stderr:\n%s", c.msg, got, attempts, c.min, c.max, tail(p.stderr))
				}
			}
		})
	}
}
