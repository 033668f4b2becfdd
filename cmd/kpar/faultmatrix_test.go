package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/internal/ledger"
)

// TestFaultMatrix is the process half of issue 35's fault matrix: each
// fault that needs the built binary (rows: `kpar broker --data-dir`
// restarted, the kpar process killed with SIGKILL) on each way of
// consuming (group classic, group consumer, share group, backfill), at
// least once and, for groups, --exactly-once (a share group refuses it
// with a usage error and backfill has no such flag: those cells are
// "refused"). Each cell is judged by the ledger (internal/ledger): nothing
// lost, nothing dead-lettered (the endpoint never refuses a record, so
// every dead letter is wrong), duplicates within the cell's bound (see
// fmDupBound), no commit gap (groups) and no stretch without progress
// past fmStallBound, and /readyz truthful: not ready during every stretch
// longer than --ready-stall plus a margin in which records waited and
// none finished, ready again once all are done. Backfill has no /readyz.
// Under --exactly-once each record's reply is read back read_committed:
// exactly one each.
//
// The CI form is short (fmRecords per phase, one fault per cell);
// KPAR_SOAK=1 runs the soak form (fmSoakRecords, fmSoakReps faults per
// cell), whose figures are in BENCHMARKS.md. The root package's
// TestFaultMatrix* have the other columns (outage, certificate, hanging
// record, oversized output).
func TestFaultMatrix(t *testing.T) {
	skipOnRealCluster(t, "it kills and restarts the broker")
	for _, fault := range []string{"broker-restart", "kill-9"} {
		t.Run(fault, func(t *testing.T) {
			for _, src := range []string{"group-classic", "group-consumer", "share", "backfill"} {
				for _, eos := range []bool{false, true} {
					if eos && !strings.HasPrefix(src, "group") {
						continue // refused: see the doc comment
					}
					mode := map[bool]string{false: "at-least-once", true: "exactly-once"}[eos]
					t.Run(src+"/"+mode, func(t *testing.T) {
						cell := fault + "/" + src + "/" + mode
						if why, known := fmKnownFailures[cell]; known && os.Getenv("KPAR_FAULTMATRIX_KNOWN") == "" {
							t.Skipf("fails on today's code (KPAR_FAULTMATRIX_KNOWN=1 runs it; figures in BENCHMARKS.md, \"The fault matrix\"): %s", why)
						}
						t.Parallel()
						runFaultCell(t, fault, src, eos)
					})
				}
			}
		})
	}
}

// fmKnownFailures are the cells that fail on today's code, keyed
// "fault/source/mode", with why. They are skipped unless
// KPAR_FAULTMATRIX_KNOWN=1, so that the matrix guards the cells that pass;
// issue 35 stays open until this map is empty.
var fmKnownFailures = map[string]string{}

// fmKnownDuplicates are the cells that run, judged on everything but
// their duplicate deliveries, which exceed the bound on today's code, with
// why; KPAR_FAULTMATRIX_KNOWN=1 holds them to the bound too. Issue 35
// stays open until this map is empty as well.
var fmKnownDuplicates = map[string]string{}

const (
	fmRecords     = 600  // records per phase, CI
	fmSoakRecords = 5000 // records per phase, KPAR_SOAK=1
	fmSoakReps    = 5    // faults per cell, KPAR_SOAK=1
	fmSoakEnv     = "KPAR_SOAK"
	fmConcurrency = 8
	fmPartitions  = 4
	fmKeys        = 100
	// fmReadyStall is the members' --ready-stall, and fmReadyMargin what
	// the judge adds for /readyz's own evaluation and its polling.
	fmReadyStall  = time.Second
	fmReadyMargin = 2 * time.Second
	// fmOutage is how long the broker stays down.
	fmOutage = 4 * time.Second
	// fmSession is the groups' session timeout: after a kill -9, a new
	// member waits for the dead one's session to expire (consumer
	// protocol, classic without --instance-id, and a share group: kpar
	// broker --share-session-timeout).
	fmSession = 6 * time.Second
	// fmStallBound bounds every commit gap and every stretch without
	// progress: a session timeout, franz-go's rejoin backoff (up to 5s,
	// UNRELEASED_INSTANCE_ID), the outage, and a loaded machine's slack.
	fmStallBound = 45 * time.Second
)

// fmDupBound is how many duplicate deliveries one fault may cost a cell:
//   - a group: the requests in flight plus what finished within one commit
//     spacing (--commit-interval 2ms) and its round trip, as in
//     TestChaosKillLoop: 4 x concurrency;
//   - a share group: the records the member had acquired and handled but
//     not yet acknowledged (a kill or a broker stop drops their
//     acknowledgements): one fetch's worth, at most fmShareAcquired;
//   - backfill: after a kill, the records in flight (concurrency), those
//     finished above each slice's saved progress (finished out of order:
//     up to concurrency per slice, one slice per partition here), and
//     those finished since the last save (--progress-interval 20ms, and a
//     save may lag one more: up to 40ms at this endpoint's ~1.2 records
//     a millisecond, about 6 x concurrency): 10 x concurrency (41 and 48
//     measured on an idle 2-core machine); after a broker restart, those
//     in flight.
func fmDupBound(src string) int64 {
	switch src {
	case "share":
		return fmShareAcquired
	case "backfill":
		return 10 * fmConcurrency
	}
	return 4 * fmConcurrency
}

// fmShareAcquired bounds the records a share-group member holds acquired
// at once (franz-go's share fetch: up to 500 records a fetch).
const fmShareAcquired = 500

// faultCell is one cell run.
type faultCell struct {
	t              *testing.T
	ctx            context.Context
	bin            string
	fault, src     string
	eos            bool
	n, reps        int
	dir            string
	broker         *brokerProcess
	addr           string
	topic, group   string
	l              *ledger.Ledger
	url            string
	args           []string // the member's or the backfill's arguments
	progress       string   // backfill's --progress file
	status         string   // the members' --metrics-listen: one port per cell, kept over restarts
	ready          *readyWatch
	outageOrKilled []time.Duration
}

func runFaultCell(t *testing.T, fault, src string, eos bool) {
	n, reps := fmRecords, 1
	if os.Getenv(fmSoakEnv) != "" {
		n, reps = fmSoakRecords, fmSoakReps
	}
	bin, ctx := e2e(t, 3*time.Minute+time.Duration(reps)*time.Minute)
	c := &faultCell{t: t, ctx: ctx, bin: bin, fault: fault, src: src, eos: eos, n: n, reps: reps,
		dir: t.TempDir(), topic: "fm", group: "fm"}
	c.broker, c.addr = c.startBroker("127.0.0.1:0")
	order := ledger.ByKey
	if src == "share" || src == "backfill" {
		order = ledger.Unordered
	}
	c.l = ledger.New(order, 0)
	ep := newLedgerEndpoint(t, c.l, c.topic, func(i, _ int) (int, time.Duration) {
		return http.StatusOK, time.Duration(1+i%4) * time.Millisecond // slow enough that the fault falls mid-run
	})
	c.url = ep.srv.URL
	if eos {
		c.url = withReplies(t, ep)
	}
	c.status = fmStatusAddr(t)
	c.args = c.memberArgs()
	switch {
	case src == "backfill":
		c.runBackfill()
	default:
		c.runMember()
	}
	c.judge(ep)
}

// startBroker starts `kpar broker --data-dir` on listen.
func (c *faultCell) startBroker(listen string) (*brokerProcess, string) {
	return startBrokerProcess(c.ctx, c.t, c.bin, "--listen", listen, "--partitions", strconv.Itoa(fmPartitions),
		"--data-dir", c.dir, "--share-lock-duration", "1s", "--share-session-timeout", fmSession.String())
}

func (c *faultCell) memberArgs() []string {
	common := []string{"--brokers", c.addr, "--topic", c.topic, "--url", c.url, "--concurrency", strconv.Itoa(fmConcurrency),
		"--retry-backoff", "5ms", "--log-level", chaosLogLevel()}
	switch c.src {
	case "backfill":
		c.progress = filepath.Join(c.t.TempDir(), "progress.json")
		return append(common, "--from", "0", "--to", time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339),
			"--progress", c.progress, "--progress-interval", "20ms")
	case "share":
		return append(common, "--share-group", c.group, "--metrics-listen", c.status, "--ready-stall", fmReadyStall.String())
	}
	proto := kpar.ClassicProtocol
	if c.src == "group-consumer" {
		proto = kpar.ConsumerProtocol
	}
	args := append(common, "--group", c.group, "--ordering", "key", "--commit-interval", "2ms",
		"--metrics-listen", c.status, "--ready-stall", fmReadyStall.String())
	args = append(args, setGroupTimeouts(c.ctx, c.t, c.addr, c.group, proto, fmSession)...)
	if c.eos {
		args = append(args, "--exactly-once", "--instance-id", "fm-1", "--reply-topic", "replies")
	}
	return args
}

// fmCleanBrokerEnv stops the broker with SIGTERM rather than SIGKILL in
// the groups' broker-restart cells: a clean stop, after which kfake
// keeps its in-progress transactions (session_state.json), to tell a
// lost transaction state from kpar's own doing.
const fmCleanBrokerEnv = "KPAR_FAULTMATRIX_CLEAN_BROKER_STOP"

// runMember runs a group or share-group member through reps faults, the
// records of one phase produced before each and one after the last.
func (c *faultCell) runMember() {
	t, ctx := c.t, c.ctx
	var produced atomic.Int64 // read by the readiness watch's goroutine
	produce := func() {
		from := int(produced.Load())
		produceLedger(ctx, t, c.addr, c.topic, from, from+c.n, fmKeys, c.l)
		produced.Add(int64(c.n))
	}
	produce()
	p := startMember(ctx, t, c.bin, c.args...)
	c.ready = watchReady(ctx, t, c.l, produced.Load)
	c.ready.follow(c.status)
	for range c.reps {
		c.waitFinished(p, c.l.Report().Handled+int64(c.n/3))
		at := time.Now()
		switch c.fault {
		case "broker-restart":
			// A share group's progress survives only a clean stop of kpar
			// broker (kfake writes it on Close): after a kill -9 kpar
			// broker refuses the directory (--forget-share-groups), as
			// TestBrokerRefusesLostShareGroups checks.
			sig := syscall.SIGKILL
			if c.src == "share" || os.Getenv(fmCleanBrokerEnv) != "" {
				sig = syscall.SIGTERM
			}
			c.broker.signal(ctx, t, sig)
			time.Sleep(fmOutage) // the outage itself, not a wait for anything
			c.broker, _ = c.startBroker(c.addr)
			select {
			case <-p.exited:
				t.Fatalf("kpar forward exited (%v) after the broker's restart; stderr:\n%s", p.waitErr, tail(p.stderr))
			default:
			}
		case "kill-9":
			if code := p.stop(ctx, t, syscall.SIGKILL); code != -1 {
				t.Fatalf("exit code %d after SIGKILL, want death by signal", code)
			}
			p = startMember(ctx, t, c.bin, c.args...)
		}
		c.outageOrKilled = append(c.outageOrKilled, time.Since(at))
		produce()
	}
	c.waitFinished(p, produced.Load())
	if c.eos {
		c.waitCommittedAtEnd()
	}
	c.ready.awaitReady(ctx, t, p)
	c.ready.stop()
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	if c.src != "share" {
		checkCommittedAtEnd(ctx, t, c.addr, c.group, c.topic)
	}
}

// runBackfill runs `kpar backfill --progress` over reps+1 phases of
// records produced up front, through reps faults: the broker restarted
// under it, or the backfill killed and run again with its progress file.
func (c *faultCell) runBackfill() {
	t, ctx := c.t, c.ctx
	total := c.n * (c.reps + 1)
	produceLedger(ctx, t, c.addr, c.topic, 0, total, fmKeys, c.l)
	c.ready = watchReady(ctx, t, c.l, func() int64 { return int64(total) }) // progress only: backfill has no /readyz
	p := startBackfill(ctx, t, c.bin, io.Discard, c.args...)
	for k := range c.reps {
		c.waitFinished(p, int64(c.n*k+c.n/3))
		at := time.Now()
		switch c.fault {
		case "broker-restart":
			c.broker.signal(ctx, t, syscall.SIGKILL)
			time.Sleep(fmOutage) // the outage itself
			c.broker, _ = c.startBroker(c.addr)
		case "kill-9":
			if code := p.stop(ctx, t, syscall.SIGKILL); code != -1 {
				t.Fatalf("exit code %d after SIGKILL, want death by signal", code)
			}
			p = startBackfill(ctx, t, c.bin, io.Discard, c.args...)
		}
		c.outageOrKilled = append(c.outageOrKilled, time.Since(at))
	}
	if code := p.wait(ctx, t); code != 0 {
		t.Errorf("kpar backfill exited %d, want 0 (every record handled); stderr:\n%s", code, tail(p.stderr))
	}
	c.ready.stop()
}

// waitFinished is waitFinished failing the cell as soon as the ledger
// has seen no progress for fmStallBound: a stall past the bound is a
// failed cell, with no need to wait out the cell's whole time.
func (c *faultCell) waitFinished(p *process, n int64) {
	c.t.Helper()
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	go func() {
		last, at := int64(-1), time.Now()
		for ctx.Err() == nil {
			if h := c.l.Report().Handled; h != last {
				last, at = h, time.Now()
			} else if time.Since(at) > fmStallBound {
				c.t.Logf("no record finished for %v while %d waited: the cell stalls past its bound", fmStallBound, n-h)
				cancel()
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(readyPoll):
			}
		}
	}()
	waitFinished(ctx, c.t, c.l, p, n)
}

// waitCommittedAtEnd waits, under --exactly-once, for the group's commit
// to reach every partition's end: a record is done once its transaction
// committed, after its handler returned (which is what the ledger sees).
// After a kill -9 of the broker, which forgets the group's members, a
// member handles its buffered records before it learns that (its next
// heartbeat): stopped then, its final transaction would be refused as the
// unknown member's, and its records left to a next member.
func (c *faultCell) waitCommittedAtEnd() {
	t, ctx := c.t, c.ctx
	t.Helper()
	cl := newClient(t, c.addr)
	defer cl.Close()
	ends := endOffsets(ctx, t, c.addr, c.topic)
	for deadline := time.Now().Add(fmStallBound); ; {
		offs, err := kadm.NewClient(cl).FetchOffsets(ctx, c.group)
		short := len(ends)
		if err == nil {
			short = 0
			for p, end := range ends {
				if o, ok := offs.Lookup(c.topic, p); end > 0 && (!ok || o.At != end) {
					short++
				}
			}
		}
		if short == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("every record handled, but the commit did not reach the end of %d partitions within %v (%v)", short, fmStallBound, err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(readyPoll):
		}
	}
}

// judge checks the cell's ledger, dead letters, replies, commits and
// readiness, and logs its row of the matrix.
func (c *faultCell) judge(ep *ledgerEndpoint) {
	t, ctx := c.t, c.ctx
	rep := c.l.Report()
	letters := len(readCommitted(ctx, t, c.addr, c.topic+".dlq", 0))
	var repliesMissing, repliesRepeated, repliesUncommitted int
	if c.eos {
		seen := map[string]int{}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second) // a read_committed reader stops at an open transaction for good
		replies := readCommitted(rctx, t, c.addr, "replies", int(rep.Produced))
		for _, r := range replies {
			seen[string(r.Value)]++
		}
		cancel()
		defer logRepeatedReplies(ctx, t, c.addr, replies) // faultmatrix_dump_test.go
		// What is in the log, committed or not: tells replies never
		// produced from replies behind a transaction left open.
		all := map[string]bool{}
		reader := newClient(t, c.addr, kgo.ConsumeTopics("replies"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		for quiet := 0; quiet < 3 && ctx.Err() == nil; {
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			fs := reader.PollFetches(pctx)
			cancel()
			before := len(all)
			fs.EachRecord(func(r *kgo.Record) { all[string(r.Value)] = true })
			if len(all) == before {
				quiet++
			}
		}
		reader.Close()
		repliesUncommitted = len(all) - len(seen)
		for i := range int(rep.Produced) {
			switch k := seen[fmt.Sprintf("reply to %d", i)]; {
			case k == 0:
				repliesMissing++
			case k > 1:
				repliesRepeated += k - 1
			}
		}
	}
	r := c.ready.result()
	dupBound := fmDupBound(c.src) * int64(c.reps)
	checkBound := dupBound
	if why, known := fmKnownDuplicates[c.fault+"/"+c.src+"/"+map[bool]string{false: "at-least-once", true: "exactly-once"}[c.eos]]; known && os.Getenv("KPAR_FAULTMATRIX_KNOWN") == "" {
		t.Logf("duplicates not held to the bound of %d on today's code (KPAR_FAULTMATRIX_KNOWN=1 does): %s", dupBound, why)
		checkBound = -1
	}
	t.Logf("matrix row: %s/%s eos=%v, %d records, %d faults (%v each): lost %d, wrongly dead-lettered %d, duplicates %d (bound %d), replies missing %d repeated %d (distinct replies in the log but not read_committed: %d), longest stretch without progress %v (bound %v), readiness: %s",
		c.fault, c.src, c.eos, rep.Produced, c.reps, c.outageOrKilled, rep.Lost, letters, rep.Duplicates, dupBound,
		repliesMissing, repliesRepeated, repliesUncommitted, r.longest.Round(10*time.Millisecond), fmStallBound, r.verdict(c.src))
	if bad := ep.malformed(); len(bad) > 0 {
		t.Errorf("malformed requests: %q", bad)
	}
	if err := rep.Check(checkBound); err != nil {
		t.Error(err)
	}
	if letters > 0 {
		t.Errorf("%d dead letters; the endpoint refused nothing, so every one is wrong", letters)
	}
	if repliesMissing > 0 || repliesRepeated > 0 {
		t.Errorf("--exactly-once: %d records without their reply, %d replies repeated; want exactly one each", repliesMissing, repliesRepeated)
	}
	if r.longest > fmStallBound {
		t.Errorf("%v without a record finished while records waited, want at most %v", r.longest, fmStallBound)
	}
	if c.src != "backfill" {
		for _, s := range r.stallsNotReady {
			t.Errorf("/readyz said ready throughout %s without progress while records waited (--ready-stall %v)", s, fmReadyStall)
		}
		if !r.readyAfter {
			t.Errorf("/readyz was not ready again once every record was finished; last answer %q", r.last)
		}
	}
}

// withReplies serves ep's answers with a body, "reply to <value>" for a
// 2xx, so that --reply-topic has a reply per record to produce.
func withReplies(t *testing.T, ep *ledgerEndpoint) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		w.Header().Set("Content-Type", "text/plain")
		sw := &fmStatusWriter{ResponseWriter: w}
		ep.ServeHTTP(sw, r)
		if sw.status/100 == 2 {
			fmt.Fprintf(w, "reply to %s", body)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

type fmStatusWriter struct {
	http.ResponseWriter
	status int
}

func (w *fmStatusWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }

// readyWatch samples a member's /readyz and the ledger's progress every
// readyPoll, from the first fault on, to judge readiness against what
// the records did.
type readyWatch struct {
	l        *ledger.Ledger
	produced func() int64
	addr     atomic.Pointer[string] // the current member's status address
	cancel   context.CancelFunc
	done     chan struct{}

	mu      sync.Mutex
	samples []readySample
}

type readySample struct {
	at       time.Time
	code     int // 0: no answer (the member is dead or starting)
	progress int64
	waiting  bool
	body     string
}

const readyPoll = 100 * time.Millisecond

func watchReady(ctx context.Context, t *testing.T, l *ledger.Ledger, produced func() int64) *readyWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &readyWatch{l: l, produced: produced, cancel: cancel, done: make(chan struct{})}
	t.Cleanup(w.stop)
	go func() {
		defer close(w.done)
		tick := time.NewTicker(readyPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s := readySample{at: time.Now()}
			rep := l.Report()
			s.progress = rep.Handled + rep.Duplicates
			s.waiting = rep.Handled+rep.DeadLettered < produced()
			if a := w.addr.Load(); a != nil {
				s.code, s.body = readyz(ctx, *a)
			}
			if ctx.Err() != nil {
				return // stopped mid-request: "context canceled" is the watch's, not the member's
			}
			w.mu.Lock()
			w.samples = append(w.samples, s)
			w.mu.Unlock()
		}
	}()
	return w
}

// follow points the watch at the members' status address.
func (w *readyWatch) follow(addr string) { w.addr.Store(&addr) }

// fmStatusAddr is a status address of its own for a cell, a free port
// (a fixed range collided with a second matrix run on the machine): a
// member restarted after a kill -9 serves /readyz where the dead one did,
// so the watch needs no startup line (the members log at warn).
func fmStatusAddr(t *testing.T) string {
	return "127.0.0.1:" + freePort(t)
}

// awaitReady waits (up to 30s) for /readyz to answer 200 once every record
// is finished.
func (w *readyWatch) awaitReady(ctx context.Context, t *testing.T, p *process) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	a := w.addr.Load()
	for a != nil && ctx.Err() == nil {
		if code, _ := readyz(ctx, *a); code == http.StatusOK {
			w.mu.Lock()
			w.samples = append(w.samples, readySample{at: time.Now(), code: code, progress: -1})
			w.mu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(readyPoll):
		}
	}
}

func (w *readyWatch) stop() { w.cancel(); <-w.done }

// readyResult is the judge's reading of the samples.
type readyResult struct {
	longest        time.Duration // the longest stretch without progress while records waited
	stallsNotReady []string      // stretches past --ready-stall plus margin with no 503
	notReady       int           // 503 answers
	readyAfter     bool          // 200 once every record was finished
	last           string
	sample503      string
}

func (r readyResult) verdict(src string) string {
	if src == "backfill" {
		return "n/a (kpar backfill serves no /readyz)"
	}
	v := fmt.Sprintf("%d answers 503", r.notReady)
	if r.sample503 != "" {
		v += fmt.Sprintf(" (%q)", r.sample503)
	}
	if len(r.stallsNotReady) > 0 {
		v += fmt.Sprintf(", ready throughout %d stalls", len(r.stallsNotReady))
	} else {
		v += ", not ready in every stall"
	}
	return v + map[bool]string{true: ", ready after", false: ", NOT ready after"}[r.readyAfter]
}

func (w *readyWatch) result() readyResult {
	w.mu.Lock()
	defer w.mu.Unlock()
	var r readyResult
	var from int = -1 // the first sample of the current stretch without progress
	closeStretch := func(end int) {
		if from < 0 {
			return
		}
		d := w.samples[end].at.Sub(w.samples[from].at)
		r.longest = max(r.longest, d)
		if d > fmReadyStall+fmReadyMargin {
			seen := false
			for _, s := range w.samples[from : end+1] {
				seen = seen || s.code == http.StatusServiceUnavailable || s.code == 0
			}
			if !seen {
				r.stallsNotReady = append(r.stallsNotReady, fmt.Sprintf("%v (%d samples)", d.Round(10*time.Millisecond), end-from+1))
			}
		}
		from = -1
	}
	for i, s := range w.samples {
		if s.code == http.StatusServiceUnavailable {
			r.notReady++
			if r.sample503 == "" {
				r.sample503 = strings.TrimSpace(s.body)
			}
		}
		if s.progress < 0 {
			continue // awaitReady's
		}
		switch {
		case !s.waiting || (i > 0 && s.progress != w.samples[i-1].progress):
			closeStretch(i)
		case from < 0 && s.waiting:
			from = i
		}
	}
	if len(w.samples) > 0 {
		closeStretch(len(w.samples) - 1)
		last := w.samples[len(w.samples)-1]
		r.last = fmt.Sprintf("%d %s", last.code, strings.TrimSpace(last.body))
	}
	// Only awaitReady's 200 says "ready once every record was finished": a
	// sample of the watch's that was answered before it may be appended
	// after it (CI, stop 41: a request the watch's stop cut short was).
	for _, s := range w.samples {
		r.readyAfter = r.readyAfter || (s.progress < 0 && s.code == http.StatusOK)
	}
	return r
}
