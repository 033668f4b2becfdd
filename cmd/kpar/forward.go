package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/deadletter/pgsink"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/internal/kgolog"
	"github.com/kpar/kpar/kparprom"
)

// connectTimeout bounds how long forward waits for the brokers to answer
// at startup before it gives up.
const connectTimeout = 30 * time.Second

// revokeTimeout is kpar's default RevokeTimeout, which kpar forward keeps:
// a rebalance must give a revoke that long.
const revokeTimeout = 10 * time.Second

// cmdForward consumes topics with the kpar engine and POSTs every record
// (or batch of records) to an HTTP endpoint (package forward),
// dead-lettering what the endpoint rejects or keeps failing to a Kafka
// topic, a file or a PostgreSQL table.
//
// It exits 0 after SIGINT/SIGTERM once in-flight requests finished (up to
// --shutdown-timeout) and their offsets are committed, 1 when it cannot run
// (brokers unreachable, authentication or TLS failing, a fatal client
// error), and 2 for bad usage, which includes an https --url whose
// certificate does not verify.
func cmdForward(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("forward", ` --brokers LIST --group G|--share-group G --topic T [--topic T2...] --url URL

Consumes the topics (or every topic matching --topic-regex) as a member of
consumer group G with the kpar engine, or of share group G (--share-group:
KIP-932, Kafka 4.2+; the broker hands every member records of every
partition, so members are not limited by the partition count; see below),
and POSTs every record to URL. The whole HTTP contract, with examples, is
docs/http-contract.md in the kpar repository.

Request: body = the value. Content-Type = the record's own content-type
header (any case) when it has one, else --content-type (default
application/octet-stream): give --content-type application/json for JSON
records, so that Flask's request.get_json() and express.json() read them
(--header 'Content-Type: ...' means the same). Headers Kpar-Topic,
Kpar-Partition, Kpar-Offset (together the record's idempotency key: a
record can arrive twice), Kpar-Timestamp, Kpar-Key (base64; absent for a
nil key), Kpar-Tombstone: true for a nil value (an empty body without it
is an empty value), Kpar-Headers (every record header in order with its
exact name: "name=base64, ..."), and Kpar-Header-<h> (base64) per record
header, which HTTP merges for names differing only in case. A record's
traceparent and tracestate headers are sent as the request's own, so the
endpoint continues the producer's trace. --cloudevents adds CloudEvents
binary-mode headers: ce-specversion 1.0, ce-id <topic>/<partition>/<offset>,
ce-source, ce-type, ce-time, ce-subject (the key, if text); a record with
ce_* headers (the CloudEvents Kafka binding) keeps its attributes.
With --batch N, up to N records go in one request as a JSON array of
{"topic","partition","offset","timestamp","key","value","content_type",
"headers","header_list"} (key and value base64, null when nil); the
endpoint answers 2xx with an empty body (all done) or a JSON array with
one item per record, in request order: a status (200) or an object
{"status": 422, "error": "why", "retry_after": seconds}.
Batches fill only from records in flight at once, at most one per key
(--ordering key) or partition (--ordering partition): --concurrency
defaults to 8 x --batch then (8 batches in flight), and fewer keys or
partitions than --batch leave batches partial, sent after --batch-wait.
A 2xx response finishes the record. 408, 429, 5xx, connection errors and
timeouts are retried with backoff (Retry-After honoured on 429 and 503);
after --max-attempts (and --retry-topics, if any), and at once for any
other 4xx, the record goes to the dead letters, whose message quotes the
start of the response (or the batch item's "error"). 429, 503, connection
errors and timeouts burn no attempt: an endpoint that is down, overloaded
or hanging is probed with pauses growing to 5s (or, with --adaptive, gets
fewer requests in flight), nothing is dead-lettered for it, and the log
summarises it every 10s; a timeout does burn one when the endpoint
answered other requests meanwhile (the record itself hangs it). An https
URL whose certificate does not verify is refused at start (exit 2; see
--url-ca). --rate-limit and --key-rate-limit cap requests per second. Offsets
are committed only below finished records; a new group starts at the
oldest record. SIGINT or SIGTERM stops fetching, finishes the fetched
records (at the rate limit, if any) for up to --shutdown-timeout, commits
and exits 0.

With --share-group, each record is acknowledged instead of committed:
ACCEPT once the endpoint took it (or once the dead letters did), retries
stay on this member with the lock renewed, and a stop RELEASEs what has
not started to the other members. No order is kept across members;
--ordering key keeps one request per key at a time in this process. A
share group without share.auto.offset.reset gets earliest.`, stderr)

	brokers := fs.String("brokers", "", "comma-separated seed brokers `host:port,...` (required)")
	group := fs.String("group", "", "consumer group `G` (this or --share-group required)")
	shareGroup := fs.String("share-group", "", "share group `G` to consume in instead of a consumer group (KIP-932, Kafka 4.2+): members share every partition; excludes --group, --instance-id, --retry-topics and --ordering partition")
	var topics, topicRegex listFlag
	fs.Var(&topics, "topic", "`TOPIC` to consume; repeat the flag or separate with commas for several (this or --topic-regex required)")
	fs.Var(&topicRegex, "topic-regex", "consume every topic matching the regular expression `RE`, including later ones; repeatable (excludes --topic, --retry-topics)")
	target := fs.String("url", "", "http or https `URL` to POST every record to (required unless --route is given; with --route, the records no route matches)")
	req := addRequestFlags(fs)
	routes := addRouteFlags(fs) // --filter, --route: route.go
	var ord kpar.Order
	fs.TextVar(&ord, "ordering", kpar.ByKey, "what runs in order, `MODE`: key (one record per key and partition at a time), partition, or unordered")
	concurrency := fs.Int("concurrency", 64, "records in flight at once, and the size of the keep-alive connection pool (with --batch N, default 8N)")
	att := addAttemptFlags(fs, "attempts per record before it is dead-lettered (or sent to the next retry topic)")
	limits := addLimitFlags(fs) // forward_limits.go
	replyTopic := fs.String("reply-topic", "", "make the body of each 2xx answer a record on `TOPIC`, keyed like its input (204 or an empty body: none; with --batch, each answer item's \"reply\"), produced at least once, or exactly once with --exactly-once")
	exactlyOnce := fs.Bool("exactly-once", false, "produce the replies (and the dead letters and retry-topic records) in one Kafka transaction with the commit of their inputs: a read_committed reader sees each exactly once; needs --group and a Kafka dead-letter sink, and a transactional ID: <group>-<--instance-id>, else <group>-<host name> (one forwarder per host)")
	txn := addTxnFlags(fs) // forward_txn.go
	retryTopics := fs.String("retry-topics", "", "comma-separated `DELAYS` (1s,30s): after --max-attempts a record goes to <topic>.retry.1, due 1s later, then <topic>.retry.2, ..., then the dead letters; the main topic is not held up")
	deadLetters := fs.String("dead-letters", "", "dead-letter sink `URL`: kafka://HOST:PORT[,...][/TOPIC], file://PATH (JSON Lines), or postgres://... / postgresql://... (kpar_table=NAME for a table other than kpar_dead_letters) (default the consumed cluster, --dlq-topic)")
	dlqTopic := fs.String("dlq-topic", "", "dead-letter `TOPIC` of a Kafka sink (default <topic>.dlq for each topic)")
	adaptive := fs.Bool("adaptive", false, "adapt the requests in flight to the endpoint, between 1 and --concurrency: fewer on 429, 503, refused connections, timeouts and rising latency, more while it answers fast (without it, an endpoint answering only those is probed with growing pauses)")
	rateLimit := fs.Float64("rate-limit", 0, "start at most `N` requests a second in all (retries included; with --batch, N records a second); 0: no limit")
	keyRateLimit := fs.Float64("key-rate-limit", 0, "start at most `N` requests a second per record key; a limited key waits while other keys go on (with --ordering partition, its partition waits too); records without a key are not limited; 0: no limit")
	rateBurst := fs.Int("rate-burst", 0, "with --rate-limit, how many requests may start at once after a quiet spell (`B`; default a tenth of a second's worth, N/10, at least 1)")
	keyRateBurst := fs.Int("key-rate-burst", 0, "with --key-rate-limit, the burst of each key (`B`; default N/10, at least 1)")
	commitInterval := fs.Duration("commit-interval", 2*time.Millisecond, "least time between two commits: a crash repeats the requests in flight plus what finished within one interval; each member commits at most 1/interval times a second, never while idle")
	commitBudget := fs.Float64("commit-budget", 1000, "at most `N` OffsetCommit requests a second from the whole group to its coordinator: each member spaces its commits by its partitions' share of it, when that is more than --commit-interval (16 members: each at most ~62/s); 0: no budget")
	var protocol kpar.Protocol
	fs.TextVar(&protocol, "group-protocol", kpar.ClassicProtocol, "the consumer group's protocol, `P`: classic (JoinGroup/SyncGroup, every Kafka) or consumer (KIP-848, Kafka 4.0+: the broker assigns, no group-wide rebalance barrier; falls back to classic on older brokers)")
	instanceID := fs.String("instance-id", "", "static group membership (KIP-345) under `ID`; give every member its own. Classic protocol: a member restarted with it within --session-timeout, after a clean stop or a kill -9, gets its partitions back at once, without a rebalance (meanwhile they wait for it). Consumer protocol: at once only after a clean stop; after a kill -9 the broker holds the ID until the dead member's session expires (45s by default: UNRELEASED_INSTANCE_ID), no sooner than without it. Also names the --exactly-once transactional ID")
	sessionTimeout := fs.Duration("session-timeout", 45*time.Second, "how long the group waits for a crashed member before giving its partitions to the others (brokers allow 6s to 30m by default); classic protocol only: in the consumer protocol the broker sets it (group.consumer.session.timeout.ms, kpar broker --consumer-session-timeout)")
	rebalanceTimeout := fs.Duration("rebalance-timeout", time.Minute, "how long a rebalance waits for the members to rejoin: a member that dies mid-rebalance holds the group (and its commits) this long; more than the 10s a revoke may wait for running records")
	metadataMaxAge := addMetadataMaxAge(fs) // forward_metadata.go
	metricsListen := fs.String("metrics-listen", "", "serve /metrics, the status page, /healthz and /readyz on `host:port` (default off)")
	readyStall := addReadyStall(fs) // readiness.go
	logLevel := addLogLevel(fs)
	sec := securityFlags(fs)
	typed := addTypedFlags(fs, true) // typed.go
	dry := addCheckConfig(fs)        // --check-config: checkconfig.go
	if code, ok := fs.parseArgs(args, "brokers"); !ok {
		return code
	}
	if code, ok := routes.checkTarget(fs, *target); !ok {
		return code
	}
	share := strings.TrimSpace(*shareGroup) != ""
	switch {
	case strings.TrimSpace(*group) == "" && !share:
		return fs.usageError("missing --group (or %s), or --share-group (or %s)", envName("group"), envName("share-group"))
	case strings.TrimSpace(*group) != "" && share:
		return fs.usageError("invalid --share-group: give either --group or --share-group, not both")
	case share && ord == kpar.ByPartition:
		return fs.usageError("invalid --ordering partition with --share-group: a share group hands one partition to many members; use --ordering key (one request per key at a time in this process) or unordered, or --group")
	case share && fs.given("group-protocol"):
		return fs.usageError("invalid --group-protocol with --share-group: a share group has a protocol of its own")
	case share && fs.given("commit-interval"):
		return fs.usageError("invalid --commit-interval with --share-group: a share group commits no offsets, each record is acknowledged as it finishes")
	case share && fs.given("commit-budget"):
		return fs.usageError("invalid --commit-budget with --share-group: a share group commits no offsets, each record is acknowledged")
	case !(*commitBudget >= 0) || math.IsInf(*commitBudget, 0):
		return fs.usageError("invalid --commit-budget %v: want commits a second above 0, or 0 for no budget", *commitBudget)
	case share && *instanceID != "":
		return fs.usageError("invalid --instance-id with --share-group: share groups have no static membership")
	case share && strings.TrimSpace(*retryTopics) != "":
		return fs.usageError("invalid --retry-topics with --share-group: retries stay on the member that holds the record (--max-attempts, --backoff), then go to the dead letters")
	}
	topicList, regexList := topics.split(","), topicRegex.values
	switch {
	case len(topicList) == 0 && len(regexList) == 0:
		return fs.usageError("missing --topic (or %s) or --topic-regex", envName("topic"))
	case len(topicList) > 0 && len(regexList) > 0:
		return fs.usageError("invalid --topic-regex: give either --topic or --topic-regex, not both")
	}
	for _, re := range regexList {
		if _, err := regexp.Compile(re); err != nil {
			return fs.usageError("invalid --topic-regex %q: %v", re, err)
		}
	}
	seeds, err := splitBrokers(*brokers)
	if err != nil {
		return fs.usageError("invalid --brokers: %v", err)
	}
	if code, ok := req.check(fs); !ok {
		return code
	}
	if *req.batch > 1 && !fs.given("concurrency") {
		*concurrency = min(max(*concurrency, 8**req.batch), 1<<16)
	}
	switch {
	case *concurrency < 1 || *concurrency > 1<<16:
		return fs.usageError("invalid --concurrency %d: want 1 to 65536", *concurrency)
	case *sessionTimeout < time.Second:
		return fs.usageError("invalid --session-timeout %v: want 1s or more", *sessionTimeout)
	case *rebalanceTimeout <= revokeTimeout:
		return fs.usageError("invalid --rebalance-timeout %v: want more than %v, the time a revoke may wait for running records", *rebalanceTimeout, revokeTimeout)
	}
	rateOpts, code, ok := rateFlags(fs, *rateLimit, *rateBurst, *keyRateLimit, *keyRateBurst)
	if !ok {
		return code
	}
	if code, ok := att.check(fs); !ok {
		return code
	}
	if code, ok := limits.check(fs); !ok {
		return code
	}
	if code, ok := txn.check(fs, *exactlyOnce); !ok {
		return code
	}
	if code, ok := checkMetadataMaxAge(fs, *metadataMaxAge); !ok {
		return code
	}
	retryDelays, err := parseDelays(*retryTopics)
	if err != nil {
		return fs.usageError("invalid --retry-topics %q: %v", *retryTopics, err)
	}
	if len(retryDelays) > 0 && len(regexList) > 0 {
		return fs.usageError("invalid --retry-topics: retry topics need named topics, not --topic-regex")
	}
	log, code, ok := fs.logger(*logLevel)
	if !ok {
		return code
	}
	sink, err := parseDeadLetters(*deadLetters)
	if err != nil {
		return fs.usageError("invalid --dead-letters: %v", err)
	}
	if *exactlyOnce && share {
		return fs.usageError("invalid --exactly-once with --share-group: a share group commits no offsets a transaction could hold; --reply-topic alone produces replies at least once")
	}
	if *exactlyOnce && sink.scheme != "kafka" {
		return fs.usageError("invalid --exactly-once with --dead-letters %s://: dead letters join the transaction, so they must go to Kafka", sink.scheme)
	}
	if *dlqTopic != "" && sink.scheme != "kafka" {
		return fs.usageError("invalid --dlq-topic: it names a Kafka topic, and --dead-letters is %s://", sink.scheme)
	}
	if sink.topic == "" {
		sink.topic = *dlqTopic
	}
	if slices.Contains(topicList, sink.topic) {
		return fs.usageError("invalid --dlq-topic %q: it is a topic being consumed", sink.topic)
	}
	base := []forward.Opt{forward.Concurrency(*concurrency), forward.Timeout(*att.timeout)}
	if *replyTopic != "" {
		base = append(base, forward.Replies(*replyTopic))
	}
	fwdOpts, code, ok := req.opts(fs, base...)
	if !ok {
		return code
	}
	typed.offline = dry.enabled()
	typedOpts, typedAttrs, code, ok := typed.opts(ctx, fs, log, *replyTopic)
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
	if *metricsListen != "" {
		if _, err := statusListenAddr(*metricsListen); err != nil {
			return fs.usageError("invalid --metrics-listen: %v", strings.TrimPrefix(err.Error(), "status server: "))
		}
	}

	fail := func(msg string, err error) int {
		log.Error(msg, "err", err)
		return 1
	}
	if protocol == kpar.ConsumerProtocol && fs.given("session-timeout") {
		log.Warn("--session-timeout does not apply with --group-protocol consumer: the broker sets the session timeout (the group's consumer.session.timeout.ms, else group.consumer.session.timeout.ms, 45s by default; kpar broker --consumer-session-timeout)")
	}
	if sec.plainTextPassword() {
		log.Warn("SASL PLAIN without TLS sends the password in clear text; add --tls or --tls-ca")
	}
	if *req.batch > 1 && *concurrency < 2**req.batch {
		log.Warn("--concurrency is below 2 x --batch: batches cannot fill while one is in flight, and go out after --batch-wait",
			"concurrency", *concurrency, "batch", *req.batch)
	}

	dl, closeSink, err := dry.openSink(ctx, sink, seeds, secOpts, log)
	if err != nil {
		return fail("kpar forward: opening the dead-letter sink", err)
	}
	defer closeSink()

	consumeOpts := []kgo.Opt{
		kgo.SessionTimeout(*sessionTimeout),
		kgo.RebalanceTimeout(*rebalanceTimeout),
		// Three heartbeats per session timeout, as Kafka advises.
		kgo.HeartbeatInterval(min(3*time.Second, *sessionTimeout/3)),
	}
	subscribed := topicList
	var handler kpar.Handler = h
	if len(regexList) > 0 {
		subscribed = regexList
		handler = skipDeadLetters(h, sink, log)
	}
	membership := []kpar.ConsumerOpt{kpar.Group(*group), kpar.InstanceID(*instanceID), kpar.GroupProtocol(protocol), kpar.CommitBudget(*commitBudget), kpar.CommitInterval(*commitInterval)}
	if share {
		membership = []kpar.ConsumerOpt{kpar.ShareGroup(*shareGroup)}
	}
	switch {
	case *exactlyOnce:
		membership = append(membership, kpar.ExactlyOnce())
		if *instanceID == "" {
			host, err := os.Hostname()
			if err != nil {
				return fs.usageError("invalid --exactly-once: no --instance-id, and no host name to derive a transactional ID from (%v): give --instance-id", err)
			}
			membership = append(membership, kpar.TransactionalID(*group+"-"+host))
		}
	case *replyTopic != "":
		membership = append(membership, kpar.Outputs())
	}
	opts := []kpar.ConsumerOpt{
		kpar.Brokers(seeds...),
		kpar.ClientOptions(append(consumeOpts, secOpts...)...),
		// The reply topic may be created by its first record, where the
		// cluster allows it (kpar broker does).
		kpar.ClientOptions(kgo.AllowAutoTopicCreation()),
		kpar.Topics(subscribed...),
		kpar.Concurrency(*concurrency),
		kpar.Ordering(ord),
		kpar.DeadLetters(dl),
		kpar.WithLogger(log),
	}
	opts = append(opts, membership...)
	opts = append(opts, txn.opts(*exactlyOnce)...)
	opts = append(opts, metadataOpts(*metadataMaxAge)...)
	for _, o := range att.opts() {
		opts = append(opts, o)
	}
	for _, o := range rateOpts {
		opts = append(opts, o)
	}
	for _, o := range limits.opts() {
		opts = append(opts, o)
	}
	if *adaptive {
		opts = append(opts, kpar.AdaptiveConcurrency())
	}
	if len(regexList) > 0 {
		opts = append(opts, kpar.TopicRegex())
	}
	if len(retryDelays) > 0 {
		opts = append(opts, kpar.RetryTopics(retryDelays...))
	}
	var metrics *kparprom.Metrics
	if *metricsListen != "" {
		metrics = kparprom.New()
		opts = append(opts, kpar.WithHooks(metrics), kpar.ClientOptions(metrics.ClientOpts()...))
	}
	var stall *stallWatch // /readyz from progress: readiness.go
	if *metricsListen != "" {
		stall = newStallWatch(readyStall.grace(*att.timeout))
		opts = append(opts, stall.opts()...)
	}
	reach := newBrokerWatch(log, "kpar forward") // unreachable brokers, a held join: brokerwatch.go
	opts = append(opts, reach.opts()...)
	if stall != nil {
		stall.brokers = reach
	}
	c, err := kpar.New(handler, opts...)
	if err != nil {
		return dry.invalid(fail("kpar forward: invalid configuration", err))
	}

	// The status server outlives the drain that follows a signal, so that
	// /healthz and the page keep answering until the consumer is done.
	statusCtx, stopStatus := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStatus()
	if metrics != nil && !dry.enabled() {
		bound, err := serveStatus(statusCtx, *metricsListen, c, metrics, stall, h.collectors()...)
		if err != nil {
			return fail("kpar forward: cannot serve --metrics-listen", err)
		}
		*metricsListen = bound
	}

	groupKey, groupName := "group", *group
	if share {
		groupKey, groupName = "share_group", *shareGroup
	}
	attrs := []any{
		"brokers", strings.Join(seeds, ","), groupKey, groupName,
		"url", redactURL(*target), "ordering", ord.String(), "concurrency", *concurrency,
		"max_attempts", *att.maxAttempts, "attempt_timeout", *att.timeout,
		"dead_letters", sink.describe(), "tls", sec.usesTLS(),
	}
	attrs = append(attrs, contentTypeAttrs(*req.batch, *req.contentType)...)
	attrs = append(attrs, limits.attrs()...)
	attrs = append(attrs, txn.attrs(*exactlyOnce)...)
	attrs = append(attrs, "metadata_max_age", *metadataMaxAge)
	if !share {
		attrs = append(attrs, "group_protocol", protocol.String())
	}
	if *replyTopic != "" {
		attrs = append(attrs, "reply_topic", *replyTopic, "exactly_once", *exactlyOnce)
	}
	if len(regexList) > 0 {
		attrs = append(attrs, "topic_regex", strings.Join(regexList, ","))
	} else {
		attrs = append(attrs, "topics", strings.Join(topicList, ","))
	}
	if *req.batch > 1 {
		attrs = append(attrs, "batch", *req.batch, "batch_wait", *req.batchWait)
	}
	if *adaptive {
		attrs = append(attrs, "adaptive", true)
	}
	if *req.cloudEvents {
		attrs = append(attrs, "cloudevents", true, "ce_source", *req.ceSource, "ce_type", *req.ceType)
	}
	if *rateLimit > 0 {
		attrs = append(attrs, "rate_limit", *rateLimit, "rate_burst", defaultBurst(*rateLimit, *rateBurst))
	}
	if *keyRateLimit > 0 {
		attrs = append(attrs, "key_rate_limit", *keyRateLimit, "key_rate_burst", defaultBurst(*keyRateLimit, *keyRateBurst))
	}
	if len(retryDelays) > 0 {
		attrs = append(attrs, "retry_topics", *retryTopics)
	}
	if len(req.extra) > 0 {
		// Names only: the values are often credentials.
		attrs = append(attrs, "headers", strings.Join(slices.Sorted(maps.Keys(req.extra)), ","))
	}
	if m := sec.saslMechanism(); m != "" {
		attrs = append(attrs, "sasl", strings.ToLower(m), "sasl_user", sec.user)
	}
	if *metricsListen != "" {
		attrs = append(attrs, "metrics_listen", *metricsListen)
	}
	attrs = append(attrs, typedAttrs...)
	attrs = append(attrs, h.attrs()...)
	if dry.enabled() {
		return dry.report(stdout, attrs)
	}
	log.Info("kpar forward starting", attrs...)

	// A certificate that does not verify fails every request alike: a
	// configuration error to report now, not a reason to dead-letter
	// every record. An endpoint that does not answer yet is waited for.
	if code, ok := checkEndpoint(ctx, fs, h, *att.timeout, log); !ok {
		return code
	}

	// franz-go retries a failing connection forever, which would hide a
	// wrong password or certificate behind a quiet loop: check first, and
	// stop with the reason.
	if err := sec.checkBrokers(ctx, seeds, connectTimeout, reach.clientOpt()); err != nil {
		if ctx.Err() != nil {
			code, _ := reach.stoppedEarly(seeds, groupKey, groupName) // nothing to drain
			return code
		}
		return fail("kpar forward: cannot use the brokers", err)
	}
	if !share {
		defer reach.watchJoin(ctx, *group, protocol, *sessionTimeout, *rebalanceTimeout, *instanceID)()
	}

	stopLog := context.AfterFunc(ctx, func() {
		if share {
			log.Info("kpar forward stopping: releasing records not started, finishing in-flight requests", "shutdown_timeout", *att.shutdownWait)
			return
		}
		log.Info("kpar forward stopping: finishing in-flight requests, then committing", "shutdown_timeout", *att.shutdownWait)
	})
	defer stopLog()

	defer h.summarize(log, routeSummaryInterval, "kpar forward")()
	err = c.Run(ctx)
	if ctx.Err() != nil && !share {
		if code, early := reach.stoppedEarly(seeds, groupKey, groupName); early {
			return code
		}
	}
	if errors.Is(err, kpar.ErrFinalCommit) && ctx.Err() != nil {
		// A requested stop whose last commit failed (a rebalance
		// still waiting for a crashed member, a coordinator gone):
		// nothing is lost, what finished since the last commit that
		// landed is delivered again.
		what := "the final commit failed; records finished since the last commit that landed will be delivered again"
		if share {
			what = "the last acknowledgements were not sent; the broker delivers those records again when their locks expire"
		}
		if errors.Is(err, kpar.ErrShutdownTimeout) {
			what = "--shutdown-timeout passed with records unfinished, and " + what
		}
		log.Warn("kpar forward stopped: "+what, "err", err)
		return 0
	}
	if errors.Is(err, kpar.ErrShutdownTimeout) && ctx.Err() != nil {
		// A requested stop that could not finish everything in time:
		// nothing is lost, the rest is delivered again after a restart.
		if share {
			log.Warn("kpar forward stopped: --shutdown-timeout passed with records unfinished; they were released and will be delivered again")
			return 0
		}
		log.Warn("kpar forward stopped: --shutdown-timeout passed with records unfinished; offsets committed below them, they will be delivered again")
		return 0
	}
	if err != nil {
		if why := sec.explainConnectError(err); why != nil {
			err = why
		}
		return fail("kpar forward: stopped", err)
	}
	if share {
		st, _ := c.ShareStats()
		log.Info("kpar forward stopped: in-flight records finished and acknowledged",
			"accepted", st.Accepted, "dead_lettered", st.DeadLettered, "released", st.Released)
		return 0
	}
	log.Info("kpar forward stopped: in-flight records finished and offsets committed")
	return 0
}

// skipDeadLetters wraps h for --topic-regex: an expression such as
// ^orders also matches the dead-letter topics orders.dlq, whose records
// must not be forwarded again (nor dead-lettered to orders.dlq.dlq). They
// are passed over as done. (kgo.ConsumeExcludeTopics would keep them from
// being fetched at all, but kpar.ClientOptions cannot take it.)
func skipDeadLetters(h kpar.Handler, sink deadLetterSink, log *slog.Logger) kpar.Handler {
	if sink.scheme != "kafka" {
		return h
	}
	isDLQ := func(topic string) bool { return strings.HasSuffix(topic, ".dlq") }
	if sink.topic != "" {
		isDLQ = func(topic string) bool { return topic == sink.topic }
	}
	var warned sync.Map // topic -> struct{}: one warning per topic
	return kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if !isDLQ(r.Topic) {
			return h.Handle(ctx, r)
		}
		if _, seen := warned.LoadOrStore(r.Topic, struct{}{}); !seen {
			log.Warn("--topic-regex matches a dead-letter topic; its records are not forwarded", "topic", r.Topic)
		}
		return nil
	})
}

// contentTypeFlag checks --content-type and takes a Content-Type given
// with --header or --header-file as its alias, out of extra.
func contentTypeFlag(fs *flagSet, contentType *string, extra http.Header) (code int, ok bool) {
	if vs := extra.Values("Content-Type"); len(vs) > 0 {
		switch {
		case len(vs) > 1:
			return fs.usageError("invalid --header Content-Type: given %d times; give it once (it is --content-type)", len(vs)), false
		case fs.given("content-type") && !strings.EqualFold(vs[0], *contentType):
			return fs.usageError("invalid --header Content-Type %q: it is --content-type, which says %q; give one", vs[0], *contentType), false
		}
		*contentType = vs[0]
		extra.Del("Content-Type")
	}
	if _, err := forward.New("http://localhost/", forward.ContentType(*contentType)); err != nil {
		return fs.usageError("invalid --content-type %q: want a media type such as application/json", *contentType), false
	}
	return 0, true
}

// checkEndpoint checks the certificate of an https --url before the first
// record (forward.Handler.CheckTLS): one that does not verify is a usage
// error (exit 2), an endpoint that cannot be reached yet only a warning.
func checkEndpoint(ctx context.Context, fs *flagSet, h interface{ CheckTLS(context.Context) error }, timeout time.Duration, log *slog.Logger) (code int, ok bool) {
	cctx, cancel := context.WithTimeout(ctx, min(timeout, 10*time.Second))
	defer cancel()
	err := h.CheckTLS(cctx)
	var tlsErr *forward.TLSError
	switch {
	case errors.As(err, &tlsErr):
		return fs.usageError("invalid --url: %s", strings.TrimPrefix(err.Error(), "forward: ")), false
	case err != nil && ctx.Err() == nil:
		log.Warn("kpar forward: the --url endpoint does not answer yet; records wait for it", "err", err)
	}
	return 0, true
}

// listFlag is a repeatable string flag.
type listFlag struct{ values []string }

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

func (l *listFlag) Set(v string) error {
	l.values = append(l.values, v)
	return nil
}

// split returns the values, each also split at sep, trimmed, empty ones
// dropped: --topic a,b and KPAR_HEADER with one header per line.
func (l *listFlag) split(sep string) []string {
	var out []string
	for _, v := range l.values {
		for p := range strings.SplitSeq(v, sep) {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// given reports whether the flag was set on the command line or through
// its environment variable.
func (f *flagSet) given(name string) bool {
	set := false
	f.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	_, env := os.LookupEnv(envName(name))
	return set || env
}

// parseDelays reads --retry-topics: comma-separated durations above 0.
func parseDelays(s string) ([]time.Duration, error) {
	var ds []time.Duration
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		d, err := time.ParseDuration(p)
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration", p)
		}
		if d <= 0 {
			return nil, fmt.Errorf("delay %v: want more than 0", d)
		}
		ds = append(ds, d)
	}
	if strings.TrimSpace(s) != "" && len(ds) == 0 {
		return nil, errors.New("no delay in the list")
	}
	return ds, nil
}

// requestHeaders reads --header values and the --header-file lines, each
// "Name: value". Errors name the flag (and line), never the value, which is
// often a secret.
func requestHeaders(flags []string, file string) (http.Header, error) {
	hd := http.Header{}
	add := func(line, where string) error {
		name, value, ok := strings.Cut(line, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" {
			return fmt.Errorf("invalid %s: want 'Name: value'", where)
		}
		if err := checkHeaderField(name, value); err != nil {
			return fmt.Errorf("invalid %s: %v", where, err)
		}
		hd.Add(name, value)
		return nil
	}
	for _, h := range flags {
		name, _, _ := strings.Cut(h, ":")
		if err := add(h, fmt.Sprintf("--header %q", strings.TrimSpace(name))); err != nil {
			return nil, err
		}
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("invalid --header-file: %v", err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := add(line, fmt.Sprintf("--header-file %s line %d", file, i+1)); err != nil {
				return nil, err
			}
		}
	}
	// forward.New knows which names kpar sets itself; ask it now, so that
	// the error names the header flag rather than --url.
	if _, err := forward.New("http://localhost/", forward.Header(hd)); err != nil {
		return nil, fmt.Errorf("invalid --header/--header-file: %v", strings.TrimPrefix(err.Error(), "forward: "))
	}
	return hd, nil
}

// checkHeaderField rejects a header that net/http would refuse to send.
func checkHeaderField(name, value string) error {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return fmt.Errorf("header name %q is not an HTTP token", name)
		}
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return fmt.Errorf("the value of %s has a control character", name)
		}
	}
	return nil
}

// readCAs reads PEM CA certificates.
func readCAs(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// deadLetterSink is a parsed --dead-letters URL: the same forms `kpar dlq
// --source` reads.
type deadLetterSink struct {
	scheme  string   // kafka, file, postgres
	brokers []string // kafka: nil means the consumed cluster
	topic   string   // kafka: "" means <topic>.dlq per topic
	path    string   // file
	dsn     string   // postgres, without kpar_table
	table   string   // postgres
}

func parseDeadLetters(raw string) (deadLetterSink, error) {
	if raw == "" {
		return deadLetterSink{scheme: "kafka"}, nil
	}
	scheme, rest, _ := strings.Cut(raw, "://")
	switch strings.ToLower(scheme) {
	case "kafka":
		hosts, path, _ := strings.Cut(rest, "/")
		if strings.TrimSpace(path) == "" {
			seeds, err := splitBrokers(hosts)
			if err != nil {
				return deadLetterSink{}, fmt.Errorf("%q: %v", raw, err)
			}
			return deadLetterSink{scheme: "kafka", brokers: seeds}, nil
		}
		seeds, ts, err := deadletter.ParseKafkaURL(raw)
		if err != nil {
			return deadLetterSink{}, errors.New(strings.TrimPrefix(err.Error(), "deadletter: "))
		}
		if len(ts) > 1 {
			return deadLetterSink{}, fmt.Errorf("%q: name one topic", raw)
		}
		if _, err := splitBrokers(strings.Join(seeds, ",")); err != nil {
			return deadLetterSink{}, fmt.Errorf("%q: %v", raw, err)
		}
		return deadLetterSink{scheme: "kafka", brokers: seeds, topic: ts[0]}, nil
	case "file":
		if rest == "" {
			return deadLetterSink{}, fmt.Errorf("%q: no path", raw)
		}
		return deadLetterSink{scheme: "file", path: rest}, nil
	case "postgres", "postgresql":
		u, err := url.Parse(raw)
		if err != nil {
			return deadLetterSink{}, fmt.Errorf("not a URL: %v", err)
		}
		q := u.Query()
		table := q.Get(pgsink.TableParam)
		q.Del(pgsink.TableParam)
		u.RawQuery = q.Encode()
		return deadLetterSink{scheme: "postgres", dsn: u.String(), table: table}, nil
	}
	return deadLetterSink{}, fmt.Errorf("%q: want kafka://, file://, postgres:// or postgresql://", redactURL(raw))
}

// describe is the sink for the start-up log line, without passwords.
func (s deadLetterSink) describe() string {
	switch s.scheme {
	case "file":
		return "file://" + s.path
	case "postgres":
		return redactURL(s.dsn)
	}
	where := "the consumed cluster"
	if s.brokers != nil {
		where = strings.Join(s.brokers, ",")
	}
	topic := s.topic
	if topic == "" {
		topic = "<topic>.dlq"
	}
	return fmt.Sprintf("kafka topic %s on %s", topic, where)
}

// open makes the sink. A Kafka sink gets a producer client of its own,
// with the consumer's security, placing each letter on the partition that
// matches its original (see deadletter.NewKafkaSink).
func (s deadLetterSink) open(ctx context.Context, seeds []string, secOpts []kgo.Opt, log *slog.Logger) (deadletter.Sink, func(), error) {
	switch s.scheme {
	case "file":
		fs, err := deadletter.NewFileSink(s.path)
		if err != nil {
			return nil, nil, err
		}
		return fs, func() { _ = fs.Close() }, nil
	case "postgres":
		var opts []pgsink.Opt
		if s.table != "" {
			opts = append(opts, pgsink.Table(s.table))
		}
		ps, err := pgsink.Open(ctx, s.dsn, opts...)
		if err != nil {
			return nil, nil, err
		}
		return ps, ps.Close, nil
	}
	if s.brokers != nil {
		seeds = s.brokers
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.AllowAutoTopicCreation(),
		kgo.WithLogger(kgolog.Logger{L: log.With("client", "dead-letters")}),
	}, secOpts...)...)
	if err != nil {
		return nil, nil, err
	}
	// SinkTopic("") keeps the sink's default, <topic>.dlq per topic.
	return deadletter.NewKafkaSink(cl, deadletter.SinkTopic(s.topic), deadletter.SinkLogger(log)), cl.Close, nil
}

// splitBrokers splits a comma-separated list of host:port.
func splitBrokers(s string) ([]string, error) {
	var seeds []string
	for _, b := range strings.Split(s, ",") {
		b = strings.TrimSpace(b)
		if b == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(b); err != nil {
			return nil, fmt.Errorf("%q is not host:port", b)
		}
		seeds = append(seeds, b)
	}
	if len(seeds) == 0 {
		return nil, errors.New("no broker in the list")
	}
	return seeds, nil
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}

// rateFlags checks --rate-limit, --key-rate-limit and their bursts and
// turns them into options.
func rateFlags(fs *flagSet, rate float64, burst int, keyRate float64, keyBurst int) (opts []kpar.FlowOpt, code int, ok bool) {
	for _, f := range []struct {
		name, burstName string
		rate            float64
		burst           int
		opt             func(float64, int) kpar.FlowOpt
	}{
		{"rate-limit", "rate-burst", rate, burst, kpar.RateLimit},
		{"key-rate-limit", "key-rate-burst", keyRate, keyBurst, kpar.KeyRateLimit},
	} {
		switch {
		case !(f.rate >= 0) || math.IsInf(f.rate, 1):
			return nil, fs.usageError("invalid --%s %v: want requests a second above 0 (0.5: one every 2s), or 0 for no limit", f.name, f.rate), false
		case f.burst < 0:
			return nil, fs.usageError("invalid --%s %d: want 1 or more, or 0 for the default", f.burstName, f.burst), false
		case f.rate == 0 && f.burst > 0:
			return nil, fs.usageError("invalid --%s: it needs --%s", f.burstName, f.name), false
		case f.rate > 0:
			opts = append(opts, f.opt(f.rate, defaultBurst(f.rate, f.burst)))
		}
	}
	return opts, 0, true
}

// defaultBurst is burst, or when it is 0 a tenth of a second's worth of
// rate, at least 1: --rate-limit 500 lets no second start more than 550.
func defaultBurst(rate float64, burst int) int {
	if burst > 0 {
		return burst
	}
	return max(1, int(math.Ceil(rate/10)))
}
