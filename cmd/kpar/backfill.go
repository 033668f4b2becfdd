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

	"github.com/kpar/kpar"
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
	fs := newFlagSet("backfill", ` --brokers LIST --topic T --from X --to Y --url URL

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
usage or range.`, stderr)
	brokers := fs.String("brokers", "", "comma-separated seed brokers `host:port,...` (required)")
	topic := fs.String("topic", "", "topic `T` to read (required)")
	partitions := fs.String("partitions", "", "comma-separated `LIST` of partitions to read (default every partition)")
	from := fs.String("from", "", "first offset or RFC 3339 time `X` of the range, inclusive (required)")
	to := fs.String("to", "", "end offset or RFC 3339 time `Y` of the range, exclusive (required)")
	target := fs.String("url", "", "http or https `URL` to POST every record to (required unless --route is given; with --route, the records no route matches)")
	req := addRequestFlags(fs)
	routes := addRouteFlags(fs) // --filter, --route: route.go
	readers := fs.Int("readers", 1, "readers per partition, each with its own client and slice of the range")
	concurrency := fs.Int("concurrency", 64, "requests in flight at once over all readers, and the size of the keep-alive connection pool")
	progressFile := fs.String("progress", "", "keep the progress in `FILE` and resume from it (default none: a new run starts over)")
	progressInterval := fs.Duration("progress-interval", time.Second, "save the progress at most this often (and at the end)")
	att := addAttemptFlags(fs, "attempts per record before it is dead-lettered")
	limits := addLimitFlags(fs) // forward_limits.go
	deadLetters := fs.String("dead-letters", "", "dead-letter sink `URL`, as kpar forward's: kafka://HOST:PORT[,...][/TOPIC], file://PATH (JSON Lines), or postgres://... / postgresql://... (default the cluster read, --dlq-topic)")
	dlqTopic := fs.String("dlq-topic", "", "dead-letter `TOPIC` of a Kafka sink (default <topic>.dlq)")
	allowDeadLetters := fs.Bool("allow-dead-letters", false, "exit 0 when the range is done even if records were dead-lettered (default: exit 3 then, so that a pipeline notices)")
	logLevel := addLogLevel(fs)
	sec := securityFlags(fs)
	typed := addTypedFlags(fs, false) // typed.go
	if code, ok := fs.parseArgs(args, "brokers", "topic", "from", "to"); !ok {
		return code
	}
	if code, ok := routes.checkTarget(fs, *target); !ok {
		return code
	}
	seeds, err := splitBrokers(*brokers)
	if err != nil {
		return fs.usageError("invalid --brokers: %v", err)
	}
	r := kpar.Range{Topic: *topic}
	if r.Partitions, err = parsePartitions(*partitions); err != nil {
		return fs.usageError("invalid --partitions %q: %v", *partitions, err)
	}
	if r.From, err = kpar.ParsePosition(*from); err != nil {
		return fs.usageError("invalid --from: %v", strings.TrimPrefix(err.Error(), "kpar: "))
	}
	if r.To, err = kpar.ParsePosition(*to); err != nil {
		return fs.usageError("invalid --to: %v", strings.TrimPrefix(err.Error(), "kpar: "))
	}
	switch {
	case *readers < 1 || *readers > 256:
		return fs.usageError("invalid --readers %d: want 1 to 256", *readers)
	case *concurrency < 1 || *concurrency > 1<<16:
		return fs.usageError("invalid --concurrency %d: want 1 to 65536", *concurrency)
	case *progressInterval <= 0:
		return fs.usageError("invalid --progress-interval %v: want more than 0", *progressInterval)
	}
	if code, ok := att.check(fs); !ok {
		return code
	}
	if code, ok := limits.check(fs); !ok {
		return code
	}
	if code, ok := req.check(fs); !ok {
		return code
	}
	log, code, ok := fs.logger(*logLevel)
	if !ok {
		return code
	}
	sink, err := parseDeadLetters(*deadLetters)
	if err != nil {
		return fs.usageError("invalid --dead-letters: %v", err)
	}
	if *dlqTopic != "" && sink.scheme != "kafka" {
		return fs.usageError("invalid --dlq-topic: it names a Kafka topic, and --dead-letters is %s://", sink.scheme)
	}
	if sink.scheme == "kafka" && sink.topic == "" {
		if sink.topic = *dlqTopic; sink.topic == "" {
			sink.topic = *topic + ".dlq"
		}
	}
	if sink.scheme == "kafka" && sink.topic == *topic {
		return fs.usageError("invalid --dlq-topic %q: it is the topic being read", sink.topic)
	}
	fwdOpts, code, ok := req.opts(fs, forward.Concurrency(*concurrency), forward.Timeout(*att.timeout))
	if !ok {
		return code
	}
	typedOpts, typedAttrs, code, ok := typed.opts(ctx, fs, log, "")
	if !ok {
		return code
	}
	fwdOpts = append(fwdOpts, typedOpts...)
	routes.decoder = typed.decoder // the expressions read the decoded record
	h, secOpts, code, ok := routes.endpoints(fs, *target, *req.contentType, sec, fwdOpts...)
	if !ok {
		return code
	}
	defer h.CloseIdleConnections()

	fail := func(msg string, err error) int {
		log.Error(msg, "err", err)
		fmt.Fprintf(stderr, "kpar backfill: %v\n", err)
		return 1
	}
	if sec.plainTextPassword() {
		log.Warn("SASL PLAIN without TLS sends the password in clear text; add --tls or --tls-ca")
	}
	// Dead letters go where kpar forward's would; a Kafka sink has a
	// producer client of its own and puts each letter on the partition
	// matching its original.
	dl, closeSink, err := sink.open(ctx, seeds, secOpts, log)
	if err != nil {
		return fail("kpar backfill: opening the dead-letter sink", err)
	}
	defer closeSink()

	opts := []kpar.BackfillOpt{
		kpar.Brokers(seeds...),
		kpar.ClientOptions(secOpts...),
		kpar.Readers(*readers),
		kpar.Concurrency(*concurrency),
		kpar.ProgressInterval(*progressInterval),
		kpar.DeadLetters(dl),
		kpar.WithLogger(log),
	}
	for _, o := range att.opts() {
		opts = append(opts, o)
	}
	for _, o := range limits.opts() {
		opts = append(opts, o)
	}
	if *progressFile != "" {
		opts = append(opts, kpar.ProgressFile(*progressFile))
	}
	log.Info("kpar backfill starting", append([]any{"brokers", strings.Join(seeds, ","), "topic", *topic,
		"partitions", *partitions, "from", r.From, "to", r.To, "url", redactURL(*target),
		"readers", *readers, "concurrency", *concurrency, "progress", *progressFile, "dead_letters", sink.describe(),
		"max_buffered_bytes", limits.maxBuffered.String()}, append(typedAttrs, h.attrs()...)...)...)

	if code, ok := checkEndpoint(ctx, fs, h, *att.timeout, log); !ok {
		return code
	}
	if err := sec.checkBrokers(ctx, seeds, connectTimeout); err != nil {
		if ctx.Err() != nil {
			return fail("kpar backfill: stopped before starting", ctx.Err())
		}
		return fail("kpar backfill: cannot use the brokers", err)
	}
	stopSummary := h.summarize(log, routeSummaryInterval, "kpar backfill")
	res, err := kpar.Backfill(ctx, h, r, opts...)
	stopSummary()
	switch {
	case errors.Is(err, kpar.ErrBadRange), errors.Is(err, kpar.ErrProgressMismatch):
		fmt.Fprintf(stderr, "kpar backfill: %v\n", strings.TrimPrefix(err.Error(), "kpar: "))
		return 2
	case err != nil && ctx.Err() != nil:
		fmt.Fprintf(stderr, "kpar backfill: stopped before the range was done: %s\n", summary(res))
		if *progressFile != "" {
			fmt.Fprintf(stderr, "kpar backfill: progress saved in %s; run the same command again to resume\n", *progressFile)
		}
		return 1
	case err != nil:
		if why := sec.explainConnectError(err); why != nil {
			err = why
		}
		return fail("kpar backfill: stopped", err)
	}
	fmt.Fprintf(stdout, "kpar backfill: done: %s\n", summary(res))
	return deadLetteredExit(res, *allowDeadLetters, sink, stderr)
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
