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
	d, jsonOut, code, ok := parseDemo(args, stderr)
	if !ok {
		return code
	}
	sum, err := d.run(ctx, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kpar demo: %v\n", err)
		if sum == nil {
			return 1
		}
	}
	if jsonOut {
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

// demoUsage is kpar demo's synopsis and description.
const demoUsage = `

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
demo could not run.`

// parseDemo defines kpar demo's flags, parses args, checks them and makes
// the demo they ask for, and says whether --json was given.
func parseDemo(args []string, stderr io.Writer) (d *demo, jsonOut bool, code int, ok bool) {
	fs := newFlagSet("demo", demoUsage, stderr)
	records := fs.Int("records", 100000, "records to produce")
	partitions := fs.Int("partitions", 8, "partitions of the demo topic")
	keys := fs.Int("keys", 1000, "distinct record keys")
	concurrency := fs.Int("concurrency", 256, "records handled at once (the library's default is 64; the simulated handler mostly waits, so the demo uses more and its default run takes seconds)")
	var ord kpar.Order
	fs.TextVar(&ord, "ordering", kpar.ByKey, "what runs in order: `key` (per key and partition), partition, or unordered")
	maxLatency := fs.Duration("max-latency", 5*time.Millisecond, "longest simulated handling; each attempt waits a uniformly random time from 0 to this")
	failRate := fs.Float64("fail-rate", 0, "fraction of attempts that fail and are retried, from 0 to below 1")
	asJSON := fs.Bool("json", false, "print the summary as one JSON object with the keys produced, handled, duplicates, lost, order_violations, commit_violations and seconds")
	if code, ok := fs.parseArgs(args); !ok {
		return nil, false, code, false
	}
	switch {
	case *records < 1 || *records > 10_000_000:
		return nil, false, fs.usageError("invalid --records %d: want 1 to 10000000", *records), false
	case *partitions < 1 || *partitions > 1000:
		return nil, false, fs.usageError("invalid --partitions %d: want 1 to 1000", *partitions), false
	case *keys < 1 || *keys > 1_000_000:
		return nil, false, fs.usageError("invalid --keys %d: want 1 to 1000000", *keys), false
	case *concurrency < 1 || *concurrency > 1<<16:
		return nil, false, fs.usageError("invalid --concurrency %d: want 1 to 65536", *concurrency), false
	case *maxLatency < 0 || *maxLatency > 10*time.Second:
		return nil, false, fs.usageError("invalid --max-latency %v: want 0 to 10s", *maxLatency), false
	case !(*failRate >= 0 && *failRate < 1): // also rejects NaN
		return nil, false, fs.usageError("invalid --fail-rate %v: want 0 to below 1", *failRate), false
	}
	l := ledger.New(ledger.ByKey, int64(*records)) // key order, in every mode: unordered shows what it costs
	return &demo{
		records:     *records,
		partitions:  *partitions,
		keys:        *keys,
		concurrency: *concurrency,
		ordering:    ord,
		maxLatency:  *maxLatency,
		failRate:    *failRate,
		ledger:      l,
		commits:     &commitTracker{topic: demoTopic, ledger: l, offsets: map[int32]int64{}},
	}, *asJSON, 0, true
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
	producer, consumer, err := d.clients(ctx, broker.Addr())
	if err != nil {
		return nil, err
	}
	defer producer.Close()

	r := &demoRun{d: d, view: newDemoView(stderr, d), start: time.Now(), consumer: consumer}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	r.runDone = make(chan error, 1)
	go func() { r.runDone <- consumer.Run(runCtx) }()
	prodCtx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	r.prodDone = make(chan error, 1)
	go func() { r.prodDone <- d.produce(prodCtx, producer) }()
	r.ticker = time.NewTicker(r.view.interval())
	defer r.ticker.Stop()

	r.wait(ctx)
	r.drain(ctx, stopProducing, stopRun)
	elapsed := time.Since(r.start)
	r.view.finish(d.progress(r.start, nil))
	return d.summary(ctx, elapsed, r.finished, r.prodErr, r.runErr)
}

// clients makes the demo's producer and its kpar consumer on the broker
// at addr, and the demo topic.
func (d *demo) clients(ctx context.Context, addr string) (*kgo.Client, *kpar.Consumer, error) {
	// A partition's records must be acknowledged in the order they were
	// produced for the per-key order check to mean anything: kgo's default
	// idempotent producer guarantees that. Keys are hashed to partitions,
	// so a key's records all land in one partition.
	producer, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return nil, nil, fmt.Errorf("creating the producer: %w", err)
	}
	// The consumer joins before the topic exists otherwise, and would only
	// see it at its next metadata refresh.
	if _, err := kadm.NewClient(producer).CreateTopic(ctx, int32(d.partitions), 1, nil, demoTopic); err != nil {
		producer.Close()
		return nil, nil, fmt.Errorf("creating topic %s: %w", demoTopic, err)
	}
	consumer, err := kpar.New(kpar.HandlerFunc(d.handle),
		kpar.Brokers(addr),
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
		producer.Close()
		return nil, nil, fmt.Errorf("creating the consumer: %w", err)
	}
	return producer, consumer, nil
}

// demoRun is a demo's run in progress: the consumer's and the producer's
// goroutines report on runDone and prodDone.
type demoRun struct {
	d                 *demo
	view              *demoView
	start             time.Time
	consumer          *kpar.Consumer
	ticker            *time.Ticker
	runDone, prodDone chan error

	finished, runReturned bool
	runErr, prodErr       error
}

// wait redraws the progress until every record was handled, ctx is done,
// the producer failed or the consumer stopped.
func (r *demoRun) wait(ctx context.Context) {
	for {
		select {
		case <-r.ticker.C:
			r.view.draw(r.d.progress(r.start, r.consumer.Partitions()))
		case <-r.d.ledger.AllHandled():
			r.finished = true
			return
		case <-ctx.Done():
			return
		case err := <-r.prodDone:
			r.prodDone = nil
			if err != nil && ctx.Err() == nil {
				r.prodErr = fmt.Errorf("producing: %w", err)
				return
			}
		case r.runErr = <-r.runDone:
			r.runReturned = true
			return
		}
	}
}

// drain stops the producer (once it acknowledged every record, after a
// finished run) and the consumer, showing the progress until it returns.
func (r *demoRun) drain(ctx context.Context, stopProducing, stopRun func()) {
	r.view.draw(r.d.progress(r.start, r.consumer.Partitions()))
	// A record can be consumed before its acknowledgement reaches the
	// producer: after a finished run, wait for the last ones.
	if !r.finished {
		stopProducing()
	}
	if r.prodDone != nil {
		if err := <-r.prodDone; err != nil && r.prodErr == nil && ctx.Err() == nil {
			r.prodErr = fmt.Errorf("producing: %w", err)
		}
	}
	stopRun()
	if r.runReturned {
		if r.runErr == nil {
			r.runErr = errors.New("the consumer stopped before every record was handled")
		}
	} else if !r.finished {
		// The drain can take seconds with slow handlers: keep showing it.
		r.view.status("stopping: finishing the records in flight and buffered, then committing")
	}
	for !r.runReturned {
		select {
		case <-r.ticker.C:
			r.view.draw(r.d.progress(r.start, r.consumer.Partitions()))
		case r.runErr = <-r.runDone:
			r.runReturned = true
		}
	}
}

// summary is the run's account from the ledger, and its error from those
// of the producer and the consumer.
func (d *demo) summary(ctx context.Context, elapsed time.Duration, finished bool, prodErr, runErr error) (*demoSummary, error) {
	rep := d.ledger.Report()
	sum := &demoSummary{
		Produced:         d.produced.Load(),
		Handled:          rep.Handled,
		Duplicates:       rep.Duplicates,
		OrderViolations:  rep.OrderViolations,
		CommitViolations: rep.CommitViolations,
		Seconds:          math.Round(elapsed.Seconds()*1000) / 1000,
	}
	if finished {
		lost := sum.Produced - rep.Handled
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
