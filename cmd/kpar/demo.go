package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/cmd/kpar/internal/embedded"
	"github.com/kpar/kpar/internal/ledger"
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
earlier record of the same key; expected with --ordering unordered), commit
violations (commits past a record not finished yet, which a crash would
lose) and the wall time from the first record produced to the consumer's
exit.

Ctrl-C stops early: the consumer drains what it holds and the summary shows
the run so far. Records not handled yet are not lost, so lost is not
reported then (null in --json).

Exits 0 when nothing was lost, no commit passed an unfinished record and,
in key and partition mode, no order was violated; 1 otherwise or when the
demo could not run.`, stderr)
	records := fs.Int("records", 100000, "records to produce")
	partitions := fs.Int("partitions", 8, "partitions of the demo topic")
	keys := fs.Int("keys", 1000, "distinct record keys")
	concurrency := fs.Int("concurrency", 256, "records handled at once (the library's default is 64; the simulated handler mostly waits, so the demo uses more and its default run takes seconds)")
	var ord kpar.Order
	fs.TextVar(&ord, "ordering", kpar.ByKey, "what runs in order: `key` (per key and partition), partition, or unordered")
	maxLatency := fs.Duration("max-latency", 5*time.Millisecond, "longest simulated handling; each attempt waits a uniformly random time from 0 to this")
	failRate := fs.Float64("fail-rate", 0, "fraction of attempts that fail and are retried, from 0 to below 1")
	jsonOut := fs.Bool("json", false, "print the summary as one JSON object with the keys produced, handled, duplicates, lost, order_violations, commit_violations and seconds")
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

	l := ledger.New(ledger.ByKey, int64(*records)) // key order, in every mode: unordered shows what it costs
	d := &demo{
		records:     *records,
		partitions:  *partitions,
		keys:        *keys,
		concurrency: *concurrency,
		ordering:    ord,
		maxLatency:  *maxLatency,
		failRate:    *failRate,
		ledger:      l,
		commits:     &commitTracker{topic: demoTopic, ledger: l, offsets: map[int32]int64{}},
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

	ledger   *ledger.Ledger
	commits  *commitTracker
	produced atomic.Int64 // records the broker acknowledged
	failures atomic.Int64 // simulated failed attempts
}

// demoSummary is the summary printed at the end; its JSON form is the
// --json output. Lost is nil when the run was interrupted.
type demoSummary struct {
	Produced        int64  `json:"produced"`
	Handled         int64  `json:"handled"`
	Duplicates      int64  `json:"duplicates"`
	Lost            *int64 `json:"lost"`
	OrderViolations int64  `json:"order_violations"`
	// CommitViolations counts commits past a record not finished yet:
	// each would lose that record in a crash.
	CommitViolations int64   `json:"commit_violations"`
	Seconds          float64 `json:"seconds"`
}

// passed reports whether the run kept kpar's guarantees: nothing lost, no
// commit past an unfinished record and, unless unordered, no order
// violation.
func (d *demo) passed(s *demoSummary) bool {
	if s.Lost != nil && *s.Lost != 0 || s.CommitViolations != 0 {
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
		case <-d.ledger.AllHandled():
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

	rep := d.ledger.Report()
	handled, duplicates, violations := rep.Handled, rep.Duplicates, rep.OrderViolations
	sum := &demoSummary{
		Produced:         d.produced.Load(),
		Handled:          handled,
		Duplicates:       duplicates,
		OrderViolations:  violations,
		CommitViolations: rep.CommitViolations,
		Seconds:          math.Round(elapsed.Seconds()*1000) / 1000,
	}
	if finished {
		lost := sum.Produced - handled
		sum.Lost = &lost
	}
	if ctx.Err() != nil && (errors.Is(runErr, kpar.ErrShutdownTimeout) || errors.Is(runErr, kpar.ErrFinalCommit)) {
		// Interrupted with a backlog: the summary says what was handled,
		// and the rest is simply left for the next run.
		runErr = nil
	}
	if runErr != nil {
		runErr = fmt.Errorf("consuming: %w", runErr)
	}
	return sum, errors.Join(prodErr, runErr)
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
	d.ledger.Handled(r)
	return nil
}
