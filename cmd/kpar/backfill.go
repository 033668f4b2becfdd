package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/forward"
)

// cmdBackfill POSTs every record of a fixed range of a topic to an HTTP
// endpoint, as forward does, with several readers per partition and no
// consumer group (kpar.Backfill).
//
// It exits 0 with a one-line summary once the range is done, 3 when it is
// done but dead-lettered records on the way (exitDeadLettered, unless
// --allow-dead-letters), 1 when it cannot finish (brokers unreachable, a
// fatal client error, stopped by a signal: the progress is saved then),
// and 2 for bad usage, a bad range or a progress file of another range.
func cmdBackfill(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	bc, code, ok := parseBackfill(args, stderr)
	if !ok {
		return code
	}
	if code, ok := bc.check(); !ok {
		return code
	}
	h, secOpts, typedAttrs, code, ok := bc.endpoints(ctx, "", forward.Concurrency(*bc.concurrency), forward.Timeout(*bc.att.timeout))
	if !ok {
		return code
	}
	defer h.CloseIdleConnections()
	bc.warnPlainText()
	// Dead letters go where kpar forward's would; a Kafka sink has a
	// producer client of its own and puts each letter on the partition
	// matching its original.
	dl, closeSink, err := bc.sink.open(ctx, bc.seeds, secOpts, bc.log)
	if err != nil {
		return bc.fail("kpar backfill: opening the dead-letter sink", err)
	}
	defer closeSink()
	bc.log.Info("kpar backfill starting", bc.startAttrs(h, typedAttrs)...)
	if code, ok := checkEndpoint(ctx, bc.fs, h, *bc.att.timeout, bc.log); !ok {
		return code
	}
	if err := bc.sec.checkBrokers(ctx, bc.seeds, connectTimeout); err != nil {
		if ctx.Err() != nil {
			return bc.fail("kpar backfill: stopped before starting", ctx.Err())
		}
		return bc.fail("kpar backfill: cannot use the brokers", err)
	}
	stopSummary := h.summarize(bc.log, routeSummaryInterval, "kpar backfill")
	res, err := kpar.Backfill(ctx, h, bc.r, bc.opts(dl, secOpts)...)
	stopSummary()
	return bc.exit(ctx, res, err, stdout)
}

// backfillUsage is kpar backfill's synopsis and description.
const backfillUsage = ` --brokers LIST --topic T --from X --to Y --url URL

POSTs every record of topic T from X (inclusive) to Y (exclusive) to URL,
exactly as 'kpar forward' does, with the same request flags (--content-type,
--header, --cloudevents, --batch, --url-ca) and the same answers
(docs/http-contract.md: 2xx done; 429, 503, refused connections and
timeouts wait for the endpoint without burning an attempt; other 5xx and
408 retried; other 4xx dead-lettered), without a consumer group:
each partition's range is cut into --readers slices, each read by its own
client from its first offset to its end. X and Y are offsets (the same in
every partition) or RFC 3339 times (the first record at or after the
time, per partition). Records are handled in any order. With --progress,
the finished part of each slice is saved there (atomically, fsynced) and a
second run with the same file and range resumes where the first stopped.
SIGINT or SIGTERM finishes in-flight requests, saves the progress and
exits 1.

Exit codes: 0 done, every record handled by the endpoint; 3 done, but
this run dead-lettered records (the summary counts them; give
--allow-dead-letters to exit 0 then); 1 cannot finish or stopped; 2 bad
usage or range.`

// backfillConfig is kpar backfill's flags, and what check derives from
// them.
type backfillConfig struct {
	pipelineFlags
	topic, partitions, from, to, progressFile *string
	readers, concurrency                      *int
	progressInterval                          *time.Duration
	allowDeadLetters                          *bool
	stderr                                    io.Writer

	r kpar.Range // set by check
}

// parseBackfill defines kpar backfill's flags and parses args (and the
// KPAR_* variables) into a backfillConfig.
func parseBackfill(args []string, stderr io.Writer) (*backfillConfig, int, bool) {
	fs := newFlagSet("backfill", backfillUsage, stderr)
	bc := &backfillConfig{stderr: stderr, pipelineFlags: addPipelineFlags(fs, pipelineHelp{
		maxAttempts: "attempts per record before it is dead-lettered",
		deadLetters: "dead-letter sink `URL`, as kpar forward's: kafka://HOST:PORT[,...][/TOPIC], file://PATH (JSON Lines), or postgres://... / postgresql://... (default the cluster read, --dlq-topic)",
		dlqTopic:    "dead-letter `TOPIC` of a Kafka sink (default <topic>.dlq)",
	})}
	bc.topic = fs.String("topic", "", "topic `T` to read (required)")
	bc.partitions = fs.String("partitions", "", "comma-separated `LIST` of partitions to read (default every partition)")
	bc.from = fs.String("from", "", "first offset or RFC 3339 time `X` of the range, inclusive (required)")
	bc.to = fs.String("to", "", "end offset or RFC 3339 time `Y` of the range, exclusive (required)")
	bc.readers = fs.Int("readers", 1, "readers per partition, each with its own client and slice of the range")
	bc.concurrency = fs.Int("concurrency", 64, "requests in flight at once over all readers, and the size of the keep-alive connection pool")
	bc.progressFile = fs.String("progress", "", "keep the progress in `FILE` and resume from it (default none: a new run starts over)")
	bc.progressInterval = fs.Duration("progress-interval", time.Second, "save the progress at most this often (and at the end)")
	bc.allowDeadLetters = fs.Bool("allow-dead-letters", false, "exit 0 when the range is done even if records were dead-lettered (default: exit 3 then, so that a pipeline notices)")
	if code, ok := fs.parseArgs(args, "brokers", "topic", "from", "to"); !ok {
		return nil, code, false
	}
	return bc, 0, true
}

// check reads the range and checks the flags.
func (bc *backfillConfig) check() (code int, ok bool) {
	fs := bc.fs
	if code, ok := bc.checkTarget(); !ok {
		return code, false
	}
	var err error
	bc.r = kpar.Range{Topic: *bc.topic}
	if bc.r.Partitions, err = parsePartitions(*bc.partitions); err != nil {
		return fs.usageError("invalid --partitions %q: %v", *bc.partitions, err), false
	}
	if bc.r.From, err = kpar.ParsePosition(*bc.from); err != nil {
		return fs.usageError("invalid --from: %v", strings.TrimPrefix(err.Error(), "kpar: ")), false
	}
	if bc.r.To, err = kpar.ParsePosition(*bc.to); err != nil {
		return fs.usageError("invalid --to: %v", strings.TrimPrefix(err.Error(), "kpar: ")), false
	}
	switch {
	case *bc.readers < 1 || *bc.readers > 256:
		return fs.usageError("invalid --readers %d: want 1 to 256", *bc.readers), false
	case *bc.concurrency < 1 || *bc.concurrency > 1<<16:
		return fs.usageError("invalid --concurrency %d: want 1 to 65536", *bc.concurrency), false
	case *bc.progressInterval <= 0:
		return fs.usageError("invalid --progress-interval %v: want more than 0", *bc.progressInterval), false
	}
	if code, ok := bc.pipelineFlags.check(); !ok {
		return code, false
	}
	if bc.sink.scheme == "kafka" && bc.sink.topic == "" {
		bc.sink.topic = *bc.topic + ".dlq"
	}
	if bc.sink.scheme == "kafka" && bc.sink.topic == *bc.topic {
		return fs.usageError("invalid --dlq-topic %q: it is the topic being read", bc.sink.topic), false
	}
	return 0, true
}

// opts are the kpar options the flags make, with the dead-letter sink dl
// and the security flags' client options.
func (bc *backfillConfig) opts(dl deadletter.Sink, secOpts []kgo.Opt) []kpar.BackfillOpt {
	opts := []kpar.BackfillOpt{
		kpar.Brokers(bc.seeds...),
		kpar.ClientOptions(secOpts...),
		kpar.Readers(*bc.readers),
		kpar.Concurrency(*bc.concurrency),
		kpar.ProgressInterval(*bc.progressInterval),
		kpar.DeadLetters(dl),
		kpar.WithLogger(bc.log),
	}
	for _, o := range slices.Concat(bc.att.opts(), bc.limits.opts()) {
		opts = append(opts, o)
	}
	if *bc.progressFile != "" {
		opts = append(opts, kpar.ProgressFile(*bc.progressFile))
	}
	return opts
}

// startAttrs are the start line's fields.
func (bc *backfillConfig) startAttrs(h *endpoints, typedAttrs []any) []any {
	attrs := []any{"brokers", strings.Join(bc.seeds, ","), "topic", *bc.topic,
		"partitions", *bc.partitions, "from", bc.r.From, "to", bc.r.To, "url", redactURL(*bc.target),
		"readers", *bc.readers, "concurrency", *bc.concurrency, "progress", *bc.progressFile, "dead_letters", bc.sink.describe(),
		"max_buffered_bytes", bc.limits.maxBuffered.String()}
	return append(attrs, append(typedAttrs, h.attrs()...)...)
}

// fail logs and prints why kpar backfill cannot go on, and returns 1.
func (bc *backfillConfig) fail(msg string, err error) int {
	bc.log.Error(msg, "err", err)
	fmt.Fprintf(bc.stderr, "kpar backfill: %v\n", err)
	return 1
}

// exit reports how the backfill ended (res, err) and returns the exit
// code.
func (bc *backfillConfig) exit(ctx context.Context, res kpar.BackfillResult, err error, stdout io.Writer) int {
	switch {
	case errors.Is(err, kpar.ErrBadRange), errors.Is(err, kpar.ErrProgressMismatch):
		fmt.Fprintf(bc.stderr, "kpar backfill: %v\n", strings.TrimPrefix(err.Error(), "kpar: "))
		return 2
	case err != nil && ctx.Err() != nil:
		fmt.Fprintf(bc.stderr, "kpar backfill: stopped before the range was done: %s\n", summary(res))
		if *bc.progressFile != "" {
			fmt.Fprintf(bc.stderr, "kpar backfill: progress saved in %s; run the same command again to resume\n", *bc.progressFile)
		}
		return 1
	case err != nil:
		if why := bc.sec.explainConnectError(err); why != nil {
			err = why
		}
		return bc.fail("kpar backfill: stopped", err)
	}
	fmt.Fprintf(stdout, "kpar backfill: done: %s\n", summary(res))
	return deadLetteredExit(res, *bc.allowDeadLetters, bc.sink, bc.stderr)
}

// summary is the one-line account of a backfill run, in records (not
// attempts): how many finished, how many of those the handler finished
// (and how many of them only after a failed attempt), how many went to the
// dead-letter sink.
func summary(res kpar.BackfillResult) string {
	handled := res.Records - res.DeadLettered
	s := fmt.Sprintf("%d records: %d handled (%d after a failed attempt), %d dead-lettered, %.2f s",
		res.Records, handled, max(res.Failed-res.DeadLettered, 0), res.DeadLettered, res.Elapsed.Seconds())
	if res.AlreadyDone > 0 {
		s += fmt.Sprintf(" (resumed: %d offsets already done)", res.AlreadyDone)
	}
	return s
}

// parsePartitions parses "0,3,7"; "" means every partition (nil).
func parsePartitions(s string) ([]int32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ps []int32
	for _, f := range strings.Split(s, ",") {
		p, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
		if err != nil || p < 0 {
			return nil, fmt.Errorf("%q is not a partition number", f)
		}
		if slices.Contains(ps, int32(p)) {
			return nil, fmt.Errorf("partition %d is listed twice", p)
		}
		ps = append(ps, int32(p))
	}
	return ps, nil
}
