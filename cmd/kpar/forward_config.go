package main

import (
	"context"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
)

// forwardConfig is kpar forward's flags, and what check derives from them.
// The library validates the consumer options they make (validate): the
// CLI checks only what the library cannot see, such as the form of a flag
// or a default that depends on another flag.
type forwardConfig struct {
	pipelineFlags
	group, shareGroup, instanceID, replyTopic, retryTopics, metricsListen *string
	topics, topicRegex                                                    listFlag
	ord                                                                   kpar.Order
	protocol                                                              kpar.Protocol
	concurrency, rateBurst, keyRateBurst                                  *int
	exactlyOnce, adaptive                                                 *bool
	rateLimit, keyRateLimit, commitBudget                                 *float64
	commitInterval, sessionTimeout, rebalanceTimeout, metadataMaxAge      *time.Duration
	txn                                                                   txnFlags
	readyStall                                                            *stallFlag
	dry                                                                   checkConfig

	// Set by check.
	share                bool
	topicList, regexList []string
	retryDelays          []time.Duration
	rateOpts             []kpar.FlowOpt
	transactionalID      string // --exactly-once without --instance-id
}

// parseForward defines kpar forward's flags and parses args (and the
// KPAR_* variables) into a forwardConfig.
func parseForward(args []string, stderr io.Writer) (*forwardConfig, int, bool) {
	fs := newFlagSet("forward", forwardUsage, stderr)
	fc := &forwardConfig{pipelineFlags: addPipelineFlags(fs, pipelineHelp{
		maxAttempts: "attempts per record before it is dead-lettered (or sent to the next retry topic)",
		deadLetters: "dead-letter sink `URL`: kafka://HOST:PORT[,...][/TOPIC], file://PATH (JSON Lines), or postgres://... / postgresql://... (kpar_table=NAME for a table other than kpar_dead_letters) (default the consumed cluster, --dlq-topic)",
		dlqTopic:    "dead-letter `TOPIC` of a Kafka sink (default <topic>.dlq for each topic)",
		replies:     true,
	})}
	fc.group = fs.String("group", "", "consumer group `G` (this or --share-group required)")
	fc.shareGroup = fs.String("share-group", "", "share group `G` to consume in instead of a consumer group (KIP-932, Kafka 4.2+): members share every partition; excludes --group, --instance-id, --retry-topics and --ordering partition")
	fs.Var(&fc.topics, "topic", "`TOPIC` to consume; repeat the flag or separate with commas for several (this or --topic-regex required)")
	fs.Var(&fc.topicRegex, "topic-regex", "consume every topic matching the regular expression `RE`, including later ones; repeatable (excludes --topic, --retry-topics)")
	fs.TextVar(&fc.ord, "ordering", kpar.ByKey, "what runs in order, `MODE`: key (one record per key and partition at a time), partition, or unordered")
	fc.concurrency = fs.Int("concurrency", 64, "records in flight at once, and the size of the keep-alive connection pool (with --batch N, default 8N)")
	fc.replyTopic = fs.String("reply-topic", "", "make the body of each 2xx answer a record on `TOPIC`, keyed like its input (204 or an empty body: none; with --batch, each answer item's \"reply\"), produced at least once, or exactly once with --exactly-once")
	fc.exactlyOnce = fs.Bool("exactly-once", false, "produce the replies (and the dead letters and retry-topic records) in one Kafka transaction with the commit of their inputs: a read_committed reader sees each exactly once; needs --group and a Kafka dead-letter sink, and a transactional ID: <group>-<--instance-id>, else <group>-<host name> (one forwarder per host)")
	fc.txn = addTxnFlags(fs) // forward_txn.go
	fc.retryTopics = fs.String("retry-topics", "", "comma-separated `DELAYS` (1s,30s): after --max-attempts a record goes to <topic>.retry.1, due 1s later, then <topic>.retry.2, ..., then the dead letters; the main topic is not held up")
	fc.adaptive = fs.Bool("adaptive", false, "adapt the requests in flight to the endpoint, between 1 and --concurrency: fewer on 429, 503, refused connections, timeouts and rising latency, more while it answers fast (without it, an endpoint answering only those is probed with growing pauses)")
	fc.rateLimit = fs.Float64("rate-limit", 0, "start at most `N` requests a second in all (retries included; with --batch, N records a second); 0: no limit")
	fc.keyRateLimit = fs.Float64("key-rate-limit", 0, "start at most `N` requests a second per record key; a limited key waits while other keys go on (with --ordering partition, its partition waits too); records without a key are not limited; 0: no limit")
	fc.rateBurst = fs.Int("rate-burst", 0, "with --rate-limit, how many requests may start at once after a quiet spell (`B`; default a tenth of a second's worth, N/10, at least 1)")
	fc.keyRateBurst = fs.Int("key-rate-burst", 0, "with --key-rate-limit, the burst of each key (`B`; default N/10, at least 1)")
	fc.commitInterval = fs.Duration("commit-interval", 2*time.Millisecond, "least time between two commits: a crash repeats the requests in flight plus what finished within one interval; each member commits at most 1/interval times a second, never while idle")
	fc.commitBudget = fs.Float64("commit-budget", 1000, "at most `N` OffsetCommit requests a second from the whole group to its coordinator: each member spaces its commits by its partitions' share of it, when that is more than --commit-interval (16 members: each at most ~62/s); 0: no budget")
	fs.TextVar(&fc.protocol, "group-protocol", kpar.ClassicProtocol, "the consumer group's protocol, `P`: classic (JoinGroup/SyncGroup, every Kafka) or consumer (KIP-848, Kafka 4.0+: the broker assigns, no group-wide rebalance barrier; falls back to classic on older brokers)")
	fc.instanceID = fs.String("instance-id", "", "static group membership (KIP-345) under `ID`; give every member its own. Classic protocol: a member restarted with it within --session-timeout, after a clean stop or a kill -9, gets its partitions back at once, without a rebalance (meanwhile they wait for it). Consumer protocol: at once only after a clean stop; after a kill -9 the broker holds the ID until the dead member's session expires (45s by default: UNRELEASED_INSTANCE_ID), no sooner than without it. Also names the --exactly-once transactional ID")
	fc.sessionTimeout = fs.Duration("session-timeout", 45*time.Second, "how long the group waits for a crashed member before giving its partitions to the others (brokers allow 6s to 30m by default); classic protocol only: in the consumer protocol the broker sets it (group.consumer.session.timeout.ms, kpar broker --consumer-session-timeout)")
	fc.rebalanceTimeout = fs.Duration("rebalance-timeout", time.Minute, "how long a rebalance waits for the members to rejoin: a member that dies mid-rebalance holds the group (and its commits) this long; more than the 10s a revoke may wait for running records")
	fc.metadataMaxAge = addMetadataMaxAge(fs) // forward_metadata.go
	fc.metricsListen = fs.String("metrics-listen", "", "serve /metrics, the status page, /healthz and /readyz on `host:port` (default off)")
	fc.readyStall = addReadyStall(fs) // readiness.go
	fc.dry = addCheckConfig(fs)       // --check-config: checkconfig.go
	if code, ok := fs.parseArgs(args, "brokers"); !ok {
		return nil, code, false
	}
	return fc, 0, true
}

// check derives what the flags mean and refuses what cannot run: first
// what only the CLI knows (a missing flag, a flag's form), then whatever
// the library refuses of the options they make (validate).
func (fc *forwardConfig) check() (code int, ok bool) {
	fs := fc.fs
	if code, ok := fc.checkTarget(); !ok {
		return code, false
	}
	fc.share = strings.TrimSpace(*fc.shareGroup) != ""
	fc.topicList, fc.regexList = fc.topics.split(","), fc.topicRegex.values
	switch {
	case strings.TrimSpace(*fc.group) == "" && !fc.share:
		return fs.usageError("missing --group (or %s), or --share-group (or %s)", envName("group"), envName("share-group")), false
	case len(fc.topicList) == 0 && len(fc.regexList) == 0:
		return fs.usageError("missing --topic (or %s) or --topic-regex", envName("topic")), false
	case len(fc.topicList) > 0 && len(fc.regexList) > 0:
		return fs.usageError("invalid --topic-regex: give either --topic or --topic-regex, not both"), false
	}
	if code, ok := fc.pipelineFlags.check(); !ok {
		return code, false
	}
	if code, ok := fc.checkForwardFlags(); !ok {
		return code, false
	}
	return fc.validate()
}

// checkForwardFlags reads and checks kpar forward's own flags.
func (fc *forwardConfig) checkForwardFlags() (code int, ok bool) {
	fs := fc.fs
	if *fc.req.batch > 1 && !fs.given("concurrency") {
		*fc.concurrency = min(max(*fc.concurrency, 8**fc.req.batch), 1<<16)
	}
	switch {
	case *fc.sessionTimeout < time.Second:
		return fs.usageError("invalid --session-timeout %v: want 1s or more", *fc.sessionTimeout), false
	case *fc.rebalanceTimeout <= revokeTimeout:
		return fs.usageError("invalid --rebalance-timeout %v: want more than %v, the time a revoke may wait for running records", *fc.rebalanceTimeout, revokeTimeout), false
	case *fc.exactlyOnce && fc.sink.scheme != "kafka":
		// The library sees the sink only once it is open.
		return fs.usageError("invalid --exactly-once with --dead-letters %s://: dead letters join the transaction, so they must go to Kafka", fc.sink.scheme), false
	case slices.Contains(fc.topicList, fc.sink.topic):
		return fs.usageError("invalid --dlq-topic %q: it is a topic being consumed", fc.sink.topic), false
	}
	if fc.rateOpts, code, ok = rateFlags(fs, *fc.rateLimit, *fc.rateBurst, *fc.keyRateLimit, *fc.keyRateBurst); !ok {
		return code, false
	}
	if code, ok := fc.txn.check(fs, *fc.exactlyOnce); !ok {
		return code, false
	}
	if code, ok := checkMetadataMaxAge(fs, *fc.metadataMaxAge); !ok {
		return code, false
	}
	var err error
	if fc.retryDelays, err = parseDelays(*fc.retryTopics); err != nil {
		return fs.usageError("invalid --retry-topics %q: %v", *fc.retryTopics, err), false
	}
	if *fc.metricsListen != "" {
		if _, err := statusListenAddr(*fc.metricsListen); err != nil {
			return fs.usageError("invalid --metrics-listen: %v", strings.TrimPrefix(err.Error(), "status server: ")), false
		}
	}
	if *fc.exactlyOnce && *fc.instanceID == "" {
		host, err := os.Hostname()
		if err != nil {
			return fs.usageError("invalid --exactly-once: no --instance-id, and no host name to derive a transactional ID from (%v): give --instance-id", err), false
		}
		fc.transactionalID = *fc.group + "-" + host
	}
	return 0, true
}

// validate lets the library judge the options the flags make, before
// anything is contacted or opened: kpar.New validates and starts nothing.
// A refusal is a usage error in the flags' words (libraryRefusal).
func (fc *forwardConfig) validate() (code int, ok bool) {
	noop := kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return nil })
	if _, err := kpar.New(noop, fc.consumerOpts(nil, nil)...); err != nil {
		return fc.fs.usageError("%s", libraryRefusal(err)), false
	}
	return 0, true
}

// consumerOpts are the kpar options the flags make, with the dead-letter
// sink dl (nil: none yet) and the security flags' client options.
func (fc *forwardConfig) consumerOpts(dl deadletter.Sink, secOpts []kgo.Opt) []kpar.ConsumerOpt {
	subscribed := fc.topicList
	if len(fc.regexList) > 0 {
		subscribed = fc.regexList
	}
	opts := []kpar.ConsumerOpt{
		kpar.Brokers(fc.seeds...),
		kpar.ClientOptions(append(fc.groupClientOpts(), secOpts...)...),
		// The reply topic may be created by its first record, where the
		// cluster allows it (kpar broker does).
		kpar.ClientOptions(kgo.AllowAutoTopicCreation()),
		kpar.Topics(subscribed...),
		kpar.Concurrency(*fc.concurrency),
		kpar.Ordering(fc.ord),
		kpar.DeadLetters(dl),
		kpar.WithLogger(fc.log),
	}
	opts = append(opts, fc.membership()...)
	opts = append(opts, fc.txn.opts(*fc.exactlyOnce)...)
	opts = append(opts, metadataOpts(*fc.metadataMaxAge)...)
	for _, o := range slices.Concat(fc.att.opts(), fc.rateOpts, fc.limits.opts()) {
		opts = append(opts, o)
	}
	if *fc.adaptive {
		opts = append(opts, kpar.AdaptiveConcurrency())
	}
	if len(fc.regexList) > 0 {
		opts = append(opts, kpar.TopicRegex())
	}
	if len(fc.retryDelays) > 0 {
		opts = append(opts, kpar.RetryTopics(fc.retryDelays...))
	}
	return opts
}

// groupClientOpts are the client options of the group flags.
func (fc *forwardConfig) groupClientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(*fc.sessionTimeout),
		kgo.RebalanceTimeout(*fc.rebalanceTimeout),
		// Three heartbeats per session timeout, as Kafka advises.
		kgo.HeartbeatInterval(min(3*time.Second, *fc.sessionTimeout/3)),
	}
}

// membership is the options of the group flags, each passed when given
// (or, in a consumer group, when its default differs from the library's),
// so that the library refuses those a share group cannot keep.
func (fc *forwardConfig) membership() []kpar.ConsumerOpt {
	var opts []kpar.ConsumerOpt
	given := func(name string) bool { return !fc.share || fc.fs.given(name) }
	if *fc.group != "" {
		opts = append(opts, kpar.Group(*fc.group))
	}
	if fc.share {
		opts = append(opts, kpar.ShareGroup(*fc.shareGroup))
	}
	if *fc.instanceID != "" {
		opts = append(opts, kpar.InstanceID(*fc.instanceID))
	}
	if given("group-protocol") {
		opts = append(opts, kpar.GroupProtocol(fc.protocol))
	}
	if given("commit-budget") {
		opts = append(opts, kpar.CommitBudget(*fc.commitBudget))
	}
	if given("commit-interval") {
		opts = append(opts, kpar.CommitInterval(*fc.commitInterval))
	}
	switch {
	case *fc.exactlyOnce:
		opts = append(opts, kpar.ExactlyOnce())
		if fc.transactionalID != "" {
			opts = append(opts, kpar.TransactionalID(fc.transactionalID))
		}
	case *fc.replyTopic != "":
		opts = append(opts, kpar.Outputs())
	}
	return opts
}
