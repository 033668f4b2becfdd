package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/term"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/cmd/kpar/internal/embedded"
)

// demoTopic and demoGroup name what the demo creates on its own broker.
const (
	demoTopic = "kpar-demo"
	demoGroup = "kpar-demo"
)

// errSimulated is what the simulated handler returns for a --fail-rate
// failure; kpar retries the record.
var errSimulated = errors.New("simulated failure")

// cmdDemo starts an embedded broker, produces keyed records to it and
// consumes them with the kpar engine, checking every successful handling
// against what was produced: duplicates, lost records and per-key order.
//
// It exits 0 when the run finished with nothing lost and, in key and
// partition mode, no order violation (also after Ctrl-C, judged on what was
// handled so far); 1 when a guarantee was broken or the demo could not run;
// 2 for bad usage.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo", `

Starts an in-process Kafka broker (franz-go's kfake) on 127.0.0.1, creates
the topic kpar-demo, produces --records records to it (record i has key
"key-<i mod --keys>" and the value "key=<k> seq=<n>", n counting the records
of key k from 0) and, at the same time, consumes them with the kpar engine
and a simulated handler that waits a random 0 to --max-latency and fails a
--fail-rate fraction of its attempts, which kpar retries.

Progress goes to stderr: on a terminal a table per partition redrawn in
place (window start and end, buffered, in flight, committed, paused) under a
progress bar; otherwise one line a second. Once every record was handled the
consumer drains, commits and leaves, and the summary follows on stdout:
produced, handled (records handled successfully at least once), duplicates
(further successful handlings), lost (produced but never handled), order
violations (records whose first successful handling came before that of an
earlier record of the same key; expected with --ordering unordered) and the
wall time from the first record produced to the consumer's exit.

Ctrl-C stops early: the consumer drains what it holds and the summary shows
the run so far. Records not handled yet are not lost, so lost is not
reported then (null in --json).

Exits 0 when nothing was lost and, in key and partition mode, no order was
violated; 1 otherwise or when the demo could not run.`, stderr)
	records := fs.Int("records", 100000, "records to produce")
	partitions := fs.Int("partitions", 8, "partitions of the demo topic")
	keys := fs.Int("keys", 1000, "distinct record keys")
	concurrency := fs.Int("concurrency", 256, "records handled at once (the library's default is 64; the simulated handler mostly waits, so the demo uses more and its default run takes seconds)")
	var ord kpar.Order
	fs.TextVar(&ord, "ordering", kpar.ByKey, "what runs in order: `key` (per key and partition), partition, or unordered")
	maxLatency := fs.Duration("max-latency", 5*time.Millisecond, "longest simulated handling; each attempt waits a uniformly random time from 0 to this")
	failRate := fs.Float64("fail-rate", 0, "fraction of attempts that fail and are retried, from 0 to below 1")
	jsonOut := fs.Bool("json", false, "print the summary as one JSON object with the keys produced, handled, duplicates, lost, order_violations and seconds")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return fs.usageError("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case *records < 1 || *records > 10_000_000:
		return fs.usageError("invalid --records %d: want 1 to 10000000", *records)
	case *partitions < 1 || *partitions > 1000:
		return fs.usageError("invalid --partitions %d: want 1 to 1000", *partitions)
	case *keys < 1 || *keys > 1_000_000:
		return fs.usageError("invalid --keys %d: want 1 to 1000000", *keys)
	case *concurrency < 1 || *concurrency > 1<<16:
		return fs.usageError("invalid --concurrency %d: want 1 to 65536", *concurrency)
	case *maxLatency < 0 || *maxLatency > 10*time.Second:
		return fs.usageError("invalid --max-latency %v: want 0 to 10s", *maxLatency)
	case !(*failRate >= 0 && *failRate < 1): // also rejects NaN
		return fs.usageError("invalid --fail-rate %v: want 0 to below 1", *failRate)
	}

	d := &demo{
		records:     *records,
		partitions:  *partitions,
		keys:        *keys,
		concurrency: *concurrency,
		ordering:    ord,
		maxLatency:  *maxLatency,
		failRate:    *failRate,
		ledger:      newLedger(*records, *keys),
		commits:     &commitTracker{topic: demoTopic, offsets: map[int32]int64{}},
	}
	sum, err := d.run(ctx, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kpar demo: %v\n", err)
		if sum == nil {
			return 1
		}
	}
	if *jsonOut {
		b, _ := json.Marshal(sum)
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		d.printSummary(stdout, sum)
	}
	if err != nil || !d.passed(sum) {
		return 1
	}
	return 0
}

// demo is one run of `kpar demo`.
type demo struct {
	records, partitions, keys, concurrency int
	ordering                               kpar.Order
	maxLatency                             time.Duration
	failRate                               float64

	ledger   *ledger
	commits  *commitTracker
	produced atomic.Int64 // records the broker acknowledged
	failures atomic.Int64 // simulated failed attempts
}

// demoSummary is the summary printed at the end; its JSON form is the
// --json output. Lost is nil when the run was interrupted.
type demoSummary struct {
	Produced        int64   `json:"produced"`
	Handled         int64   `json:"handled"`
	Duplicates      int64   `json:"duplicates"`
	Lost            *int64  `json:"lost"`
	OrderViolations int64   `json:"order_violations"`
	Seconds         float64 `json:"seconds"`
}

// passed reports whether the run kept kpar's guarantees: nothing lost and,
// unless unordered, no order violation.
func (d *demo) passed(s *demoSummary) bool {
	if s.Lost != nil && *s.Lost != 0 {
		return false
	}
	return d.ordering == kpar.Unordered || s.OrderViolations == 0
}

// run starts the broker, produces and consumes, and returns the summary. It
// returns a nil summary only when nothing ran; with an error and a summary,
// the run started and failed.
func (d *demo) run(ctx context.Context, stderr io.Writer) (*demoSummary, error) {
	broker, err := embedded.Start(embedded.Config{Partitions: d.partitions})
	if err != nil {
		return nil, fmt.Errorf("starting the embedded broker: %w", err)
	}
	defer broker.Close()

	// A partition's records must be acknowledged in the order they were
	// produced for the per-key order check to mean anything: kgo's default
	// idempotent producer guarantees that. Keys are hashed to partitions,
	// so a key's records all land in one partition.
	producer, err := kgo.NewClient(kgo.SeedBrokers(broker.Addr()))
	if err != nil {
		return nil, fmt.Errorf("creating the producer: %w", err)
	}
	defer producer.Close()
	// The consumer joins before the topic exists otherwise, and would only
	// see it at its next metadata refresh.
	if _, err := kadm.NewClient(producer).CreateTopic(ctx, int32(d.partitions), 1, nil, demoTopic); err != nil {
		return nil, fmt.Errorf("creating topic %s: %w", demoTopic, err)
	}

	consumer, err := kpar.New(kpar.HandlerFunc(d.handle),
		kpar.Brokers(broker.Addr()),
		kpar.Group(demoGroup),
		kpar.Topics(demoTopic),
		kpar.Concurrency(d.concurrency),
		kpar.Ordering(d.ordering),
		// Short backoffs, so that --fail-rate shows retries without
		// stalling a key for seconds.
		kpar.RetryBackoff(5*time.Millisecond, 250*time.Millisecond),
		// Enough for in-flight attempts to finish after Ctrl-C.
		kpar.ShutdownTimeout(5*time.Second+2*d.maxLatency),
		kpar.WithHooks(d.commits),
	)
	if err != nil {
		return nil, fmt.Errorf("creating the consumer: %w", err)
	}

	view := newDemoView(stderr, d)
	start := time.Now()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runDone := make(chan error, 1)
	go func() { runDone <- consumer.Run(runCtx) }()
	prodCtx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	prodDone := make(chan error, 1)
	go func() { prodDone <- d.produce(prodCtx, producer) }()

	ticker := time.NewTicker(view.interval())
	defer ticker.Stop()
	var (
		finished, runReturned bool
		runErr, prodErr       error
	)
loop:
	for {
		select {
		case <-ticker.C:
			view.draw(d.progress(start, consumer.Partitions()))
		case <-d.ledger.all:
			finished = true
			break loop
		case <-ctx.Done():
			break loop
		case err := <-prodDone:
			prodDone = nil
			if err != nil && ctx.Err() == nil {
				prodErr = fmt.Errorf("producing: %w", err)
				break loop
			}
		case runErr = <-runDone:
			runReturned = true
			break loop
		}
	}
	view.draw(d.progress(start, consumer.Partitions()))
	// A record can be consumed before its acknowledgement reaches the
	// producer: after a finished run, wait for the last ones.
	if !finished {
		stopProducing()
	}
	if prodDone != nil {
		if err := <-prodDone; err != nil && prodErr == nil && ctx.Err() == nil {
			prodErr = fmt.Errorf("producing: %w", err)
		}
	}
	stopRun()
	if runReturned {
		if runErr == nil {
			runErr = errors.New("the consumer stopped before every record was handled")
		}
	} else if !finished {
		// The drain can take seconds with slow handlers: keep showing it.
		view.status("stopping: finishing the records in flight and buffered, then committing")
	}
	for !runReturned {
		select {
		case <-ticker.C:
			view.draw(d.progress(start, consumer.Partitions()))
		case runErr = <-runDone:
			runReturned = true
		}
	}
	elapsed := time.Since(start)
	view.finish(d.progress(start, nil))

	handled, duplicates, violations := d.ledger.counts()
	sum := &demoSummary{
		Produced:        d.produced.Load(),
		Handled:         handled,
		Duplicates:      duplicates,
		OrderViolations: violations,
		Seconds:         math.Round(elapsed.Seconds()*1000) / 1000,
	}
	if finished {
		lost := sum.Produced - handled
		sum.Lost = &lost
	}
	if runErr != nil {
		runErr = fmt.Errorf("consuming: %w", runErr)
	}
	return sum, errors.Join(prodErr, runErr)
}

// produce produces the demo's records and waits for their acknowledgement.
func (d *demo) produce(ctx context.Context, cl *kgo.Client) error {
	failed := make(chan error, 1)
	for i := range d.records {
		key, seq := i%d.keys, i/d.keys
		r := &kgo.Record{
			Topic: demoTopic,
			Key:   []byte("key-" + strconv.Itoa(key)),
			Value: fmt.Appendf(nil, "key=%d seq=%d", key, seq),
		}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case failed <- err:
				default:
				}
				return
			}
			d.produced.Add(1)
		})
		select {
		case err := <-failed:
			return err
		default:
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-failed:
		return err
	default:
		return nil
	}
}

// handle is the simulated handler.
func (d *demo) handle(ctx context.Context, r *kgo.Record) error {
	if d.maxLatency > 0 {
		t := time.NewTimer(rand.N(d.maxLatency + 1))
		select {
		case <-t.C:
		case <-ctx.Done(): // only when the shutdown timeout passed
			t.Stop()
			return ctx.Err()
		}
	}
	if d.failRate > 0 && rand.Float64() < d.failRate {
		d.failures.Add(1)
		return errSimulated
	}
	d.ledger.handled(r.Value)
	return nil
}

// ledger records every successful handling of the demo's records. Record i
// has key i mod keys and sequence number i / keys within its key, so the
// value "key=<k> seq=<n>" names record n*keys + k.
type ledger struct {
	keys  int
	total int
	all   chan struct{} // closed once every record was handled

	mu         sync.Mutex // guards the fields below; handlers call in concurrently
	times      []uint32   // successful handlings per record
	next       []int      // per key: the lowest sequence number not handled yet
	distinct   int64      // records handled at least once
	duplicates int64      // successful handlings after a record's first
	violations int64      // first handlings that overtook an earlier record of their key
}

func newLedger(records, keys int) *ledger {
	return &ledger{
		keys:  keys,
		total: records,
		all:   make(chan struct{}),
		times: make([]uint32, records),
		next:  make([]int, keys),
	}
}

// handled records a successful handling of the record with this value.
// Values the demo did not produce are ignored.
func (l *ledger) handled(value []byte) {
	key, seq, ok := parseDemoValue(value)
	if !ok || key >= l.keys || seq >= l.total || seq*l.keys+key >= l.total {
		return
	}
	i := seq*l.keys + key
	l.mu.Lock()
	defer l.mu.Unlock()
	l.times[i]++
	if l.times[i] > 1 {
		l.duplicates++
		return
	}
	l.distinct++
	if seq != l.next[key] { // an earlier record of this key is not handled yet
		l.violations++
	}
	for n := l.next[key]; ; n++ {
		if j := n*l.keys + key; j >= l.total || l.times[j] == 0 {
			l.next[key] = n
			break
		}
	}
	if l.distinct == int64(l.total) {
		close(l.all)
	}
}

func (l *ledger) counts() (handled, duplicates, violations int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.distinct, l.duplicates, l.violations
}

// parseDemoValue parses "key=<k> seq=<n>".
func parseDemoValue(v []byte) (key, seq int, ok bool) {
	k, s, ok := strings.Cut(string(v), " ")
	if !ok {
		return 0, 0, false
	}
	k, ok1 := strings.CutPrefix(k, "key=")
	s, ok2 := strings.CutPrefix(s, "seq=")
	key, err1 := strconv.Atoi(k)
	seq, err2 := strconv.Atoi(s)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || key < 0 || seq < 0 {
		return 0, 0, false
	}
	return key, seq, true
}

// commitTracker keeps the last offsets kpar committed for the demo topic,
// which outlive the consumer's run, unlike PartitionStats.
type commitTracker struct {
	topic   string
	mu      sync.Mutex      // guards offsets
	offsets map[int32]int64 // partition -> next offset to consume
}

var _ kpar.HookCommit = (*commitTracker)(nil)

func (c *commitTracker) OnCommit(offsets map[string]map[int32]int64, err error) {
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, o := range offsets[c.topic] {
		c.offsets[p] = o
	}
}

// offset returns the offset last committed for a partition.
func (c *commitTracker) offset(partition int32) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.offsets[partition]
	return o, ok
}

// total returns the committed offsets summed over partitions: the records
// below the commit point, as the demo topic's partitions start at 0.
func (c *commitTracker) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, o := range c.offsets {
		n += o
	}
	return n
}

// demoProgress is one snapshot for the progress display.
type demoProgress struct {
	elapsed    time.Duration
	produced   int64
	handled    int64
	duplicates int64
	violations int64
	failures   int64
	committed  int64
	inFlight   int
	parts      []kpar.PartitionStats // nil once the consumer stopped
}

func (d *demo) progress(start time.Time, parts []kpar.PartitionStats) demoProgress {
	p := demoProgress{
		elapsed:   time.Since(start),
		produced:  d.produced.Load(),
		failures:  d.failures.Load(),
		committed: d.commits.total(),
		parts:     parts,
	}
	p.handled, p.duplicates, p.violations = d.ledger.counts()
	for _, s := range parts {
		p.inFlight += s.InFlight
	}
	return p
}

// demoView draws progress on stderr: in place on a terminal, one line a
// second otherwise.
type demoView struct {
	w     io.Writer
	d     *demo
	fd    int                   // the terminal's file descriptor, when tty
	tty   bool                  // redraw in place
	lines int                   // lines of the frame last drawn, to move back over
	last  []kpar.PartitionStats // the partitions last seen while running
	note  string                // shown under the table when set
	rate  rateMeter
}

func newDemoView(w io.Writer, d *demo) *demoView {
	v := &demoView{w: w, d: d}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) && os.Getenv("TERM") != "dumb" {
		v.fd, v.tty = int(f.Fd()), true
	}
	v.rate.add(time.Now(), 0)
	return v
}

func (v *demoView) interval() time.Duration {
	if v.tty {
		return 200 * time.Millisecond
	}
	return time.Second
}

func (v *demoView) draw(p demoProgress) {
	rate := v.rate.add(time.Now(), p.handled)
	if p.parts != nil {
		v.last = p.parts
	}
	if !v.tty {
		fmt.Fprintf(v.w, "kpar demo: %5.1fs  produced %d  handled %d/%d (%.0f%%)  %.0f records/s  in flight %d  committed %d%s\n",
			p.elapsed.Seconds(), p.produced, p.handled, v.d.records, percent(p.handled, v.d.records),
			rate, p.inFlight, p.committed, v.extras(p))
		return
	}
	width, height := 80, 24
	if w, h, err := term.GetSize(v.fd); err == nil {
		width, height = w, h
	}
	var b strings.Builder
	if v.lines > 0 {
		// Back to the first line of the previous frame, and clear below.
		fmt.Fprintf(&b, "\x1b[%dF\x1b[J", v.lines)
	}
	lines := 0
	line := func(format string, a ...any) {
		// A line wider than the terminal would wrap and break the count
		// of lines to move back over.
		s := []rune(fmt.Sprintf(format, a...))
		b.WriteString(string(s[:min(len(s), width-1)]))
		b.WriteByte('\n')
		lines++
	}
	line("kpar demo: %d records, %d keys, %d partitions, ordering %v, concurrency %d",
		v.d.records, v.d.keys, v.d.partitions, v.d.ordering, v.d.concurrency)
	line("%9s %10s %10s %10s %10s %10s %7s", "partition", "start", "end", "buffered", "in flight", "committed", "paused")
	// Keep the frame within the screen, with room for the "more" line.
	rows := len(p.parts)
	if rows > height-5 {
		rows = max(height-6, 0)
	}
	for _, s := range p.parts[:rows] {
		paused := ""
		if s.Paused {
			paused = "yes"
		}
		line("%9d %10s %10s %10d %10d %10s %7s", s.Partition, offset(s.Start), offset(s.End),
			s.Buffered, s.InFlight, offset(s.Committed), paused)
	}
	switch {
	case rows < len(p.parts):
		line("      ... %d more partitions", len(p.parts)-rows)
	case p.parts == nil && p.handled < int64(v.d.records):
		line("      (waiting for the partition assignment)")
	case p.parts == nil:
		line("      (consumer stopped)")
	}
	line("produced %d  committed %d%s", p.produced, p.committed, v.extras(p))
	if v.note != "" {
		line("%s", v.note)
	}
	const barWidth = 20
	filled := int(math.Round(percent(p.handled, v.d.records) / 100 * barWidth))
	line("[%s%s] %3.0f%%  %d/%d handled  %.0f rec/s  in flight %d  %.1fs",
		strings.Repeat("█", filled), strings.Repeat("░", barWidth-filled),
		percent(p.handled, v.d.records), p.handled, v.d.records, rate, p.inFlight, p.elapsed.Seconds())
	v.lines = lines
	io.WriteString(v.w, b.String())
}

// status shows a note: at once on its own line, or in the frames to come
// on a terminal.
func (v *demoView) status(note string) {
	if v.tty {
		v.note = note
		return
	}
	fmt.Fprintf(v.w, "kpar demo: %s\n", note)
}

// finish draws the last frame, after the consumer stopped: the partitions
// as last seen, with the offsets of the final commit.
func (v *demoView) finish(p demoProgress) {
	if !v.tty {
		return
	}
	p.parts = slices.Clone(v.last)
	for i := range p.parts {
		if o, ok := v.d.commits.offset(p.parts[i].Partition); ok {
			p.parts[i].Committed = o
		}
	}
	v.draw(p)
}

// extras shows the counters that are usually 0 only when they are not.
func (v *demoView) extras(p demoProgress) string {
	var s string
	if p.failures > 0 {
		s += fmt.Sprintf("  failed attempts %d", p.failures)
	}
	if p.duplicates > 0 {
		s += fmt.Sprintf("  duplicates %d", p.duplicates)
	}
	if p.violations > 0 {
		s += fmt.Sprintf("  order violations %d", p.violations)
	}
	return s
}

func offset(o int64) string {
	if o < 0 {
		return "-"
	}
	return strconv.FormatInt(o, 10)
}

func percent(n int64, of int) float64 { return 100 * float64(n) / float64(of) }

// rateMeter computes records/s over about the last second.
type rateMeter struct {
	samples []rateSample
}

type rateSample struct {
	t time.Time
	n int64
}

func (m *rateMeter) add(t time.Time, n int64) float64 {
	m.samples = append(m.samples, rateSample{t, n})
	// Keep as the base the newest sample that is at least a second old.
	for len(m.samples) > 2 && t.Sub(m.samples[1].t) >= time.Second {
		m.samples = m.samples[1:]
	}
	base := m.samples[0]
	if dt := t.Sub(base.t).Seconds(); dt > 0 {
		return float64(n-base.n) / dt
	}
	return 0
}

func (d *demo) printSummary(w io.Writer, s *demoSummary) {
	fmt.Fprintf(w, "\nkpar demo: %d records on %d partitions, %d keys, ordering %v, concurrency %d\n",
		d.records, d.partitions, d.keys, d.ordering, d.concurrency)
	fmt.Fprintf(w, "  produced          %d\n", s.Produced)
	fmt.Fprintf(w, "  handled           %d\n", s.Handled)
	fmt.Fprintf(w, "  duplicates        %d\n", s.Duplicates)
	if s.Lost != nil {
		fmt.Fprintf(w, "  lost              %d\n", *s.Lost)
	} else {
		fmt.Fprintf(w, "  lost              unknown: stopped early with %d records not handled yet\n", s.Produced-s.Handled)
	}
	fmt.Fprintf(w, "  order violations  %d\n", s.OrderViolations)
	if f := d.failures.Load(); f > 0 {
		fmt.Fprintf(w, "  failed attempts   %d (retried)\n", f)
	}
	fmt.Fprintf(w, "  committed         %d\n", d.commits.total())
	rate := 0.0
	if s.Seconds > 0 {
		rate = float64(s.Handled) / s.Seconds
	}
	fmt.Fprintf(w, "  wall time         %.2fs (%.0f records/s)\n", s.Seconds, rate)
	switch {
	case !d.passed(s):
		fmt.Fprintln(w, "FAILED: kpar broke a guarantee")
	case s.Lost == nil:
		fmt.Fprintln(w, "stopped early: no guarantee broken so far")
	case d.ordering == kpar.Unordered:
		fmt.Fprintln(w, "ok: every record handled; unordered mode keeps no order, so order violations are expected")
	default:
		fmt.Fprintf(w, "ok: every record handled, per-%v order kept\n", d.ordering)
	}
}
