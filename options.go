package kpar

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/internal/offsetmeta"
)

// Order says which records may be handled at the same time. Its text form
// (String, MarshalText, UnmarshalText) is "key", "partition" or
// "unordered", so a flag.TextVar or a configuration file can set it.
type Order int

const (
	// ByKey handles records of one partition and one key in offset order,
	// one at a time; records of other keys proceed in parallel. Records
	// with a nil key carry no ordering and are handled as in Unordered.
	// A record retried locally holds its key; one sent to a retry topic
	// does not (see RetryTopics). This is the default.
	//
	// While the handler is tiny (under 5µs a record), a partition's keyed
	// records run one after another, as in ByPartition: parallelism within
	// a partition would cost more bookkeeping than it saves, and the
	// partitions still run in parallel. A record that fails, or runs for a
	// millisecond with others waiting behind it, or a worker left idle
	// while the partition has records waiting, turns the partition back to
	// one record per key at once. While the handler is tiny, in every
	// mode, a worker also takes up to 64 consecutive records of a
	// partition as one unit and marks them finished together when it
	// ends them (or, for a record running a millisecond, sooner).
	ByKey Order = iota
	// ByPartition handles the records of a partition one at a time, in
	// offset order: the classic consumer, with partitions in parallel.
	ByPartition
	// Unordered handles any record at any time, bounded by Concurrency.
	// While the handler is tiny it runs a partition's records one after
	// another, as ByKey does (see there).
	Unordered
)

var orderNames = [...]string{ByKey: "key", ByPartition: "partition", Unordered: "unordered"}

// metaMode is the byte that names o in the commit metadata (offsetmeta).
func (o Order) metaMode() byte { return orderNames[o][0] }

// orderOfMeta is the Order a commit metadata's mode byte names, and false
// for a byte no Order has.
func orderOfMeta(mode byte) (Order, bool) {
	for i, n := range orderNames {
		if n[0] == mode {
			return Order(i), true
		}
	}
	return 0, false
}

// String returns "key", "partition" or "unordered".
func (o Order) String() string { return enumString(orderNames[:], o, "Order") }

// MarshalText implements encoding.TextMarshaler.
func (o Order) MarshalText() ([]byte, error) { return enumMarshal(orderNames[:], o, "Order") }

// UnmarshalText implements encoding.TextUnmarshaler: it accepts "key",
// "partition" or "unordered".
func (o *Order) UnmarshalText(b []byte) (err error) {
	*o, err = enumParse[Order](orderNames[:], b, "ordering")
	return err
}

// Options come in kinds, told apart at compile time as in franz-go, so that
// an option an entry point would not honour does not compile there:
//
//	             New, NewBatch   Backfill   RunMembers
//	Opt                yes          yes        yes
//	FlowOpt            yes          yes
//	GroupOpt           yes                     yes
//	ConsumerOpt        yes
//	BackfillOpt                     yes
//
// New and NewBatch take ConsumerOpt, Backfill BackfillOpt, RunMembers
// MemberOpt; Opt, FlowOpt and GroupOpt are each several of those at once.
// A rule that compiles where it cannot hold for the configuration as a
// whole (RetryTopics with ShareGroup, say) is refused by New with an error
// that says why: no option is ever silently ignored. The interfaces are
// sealed: only this package implements them.

// option is what every option is: a change to the configuration.
type option interface{ apply(*cfg) }

// ConsumerOpt configures the Consumer of New and NewBatch. Options are
// applied in order; later ones win.
type ConsumerOpt interface {
	option
	consumerOpt()
}

// BackfillOpt configures a Backfill.
type BackfillOpt interface {
	option
	backfillOpt()
}

// MemberOpt configures the members of RunMembers.
type MemberOpt interface {
	option
	memberOpt()
}

// FlowOpt is a flow rule of the pipeline that every source shares
// (concurrency, limits, retries, dead letters, stuck reports): valid for
// New, NewBatch and Backfill.
type FlowOpt interface {
	ConsumerOpt
	BackfillOpt
}

// GroupOpt configures consumer-group membership: valid for New, NewBatch
// and RunMembers.
type GroupOpt interface {
	ConsumerOpt
	MemberOpt
}

// Opt is valid everywhere: New, NewBatch, Backfill and RunMembers.
type Opt interface {
	ConsumerOpt
	BackfillOpt
	MemberOpt
}

type (
	opt         func(*cfg) // an Opt
	flowOpt     func(*cfg) // a FlowOpt
	groupOpt    func(*cfg) // a GroupOpt
	consumerOpt func(*cfg) // a ConsumerOpt
	backfillOpt func(*cfg) // a BackfillOpt
)

func (o opt) apply(c *cfg)         { o(c) }
func (opt) consumerOpt()           {}
func (opt) backfillOpt()           {}
func (opt) memberOpt()             {}
func (o flowOpt) apply(c *cfg)     { o(c) }
func (flowOpt) consumerOpt()       {}
func (flowOpt) backfillOpt()       {}
func (o groupOpt) apply(c *cfg)    { o(c) }
func (groupOpt) consumerOpt()      {}
func (groupOpt) memberOpt()        {}
func (o consumerOpt) apply(c *cfg) { o(c) }
func (consumerOpt) consumerOpt()   {}
func (o backfillOpt) apply(c *cfg) { o(c) }
func (backfillOpt) backfillOpt()   {}

type cfg struct {
	brokers    []string
	clientOpts []kgo.Opt
	group      string
	protocol   Protocol // GroupProtocol (protocol.go)
	shareGroup string   // ShareGroup (share.go): replaces group
	topics     []string
	regex      bool
	// explicit has a bit set for each option given whose default a
	// source may refuse to ignore (setX below).
	explicit uint32
	// pinnedCost, for tests only, is the handler's time per record the
	// engine goes by instead of its workers' measure (internal/cost's pinned measure).
	pinnedCost time.Duration

	concurrency         int
	ordering            Order
	batchSize           int
	windowRecords       int
	maxBytes            int64
	commitInterval      time.Duration
	commitBudget        float64 // CommitBudget (budget.go); 0 for none
	commitMetadataBytes int
	instanceID          string
	adaptive            bool
	rateLimit           rateSpec // RateLimit; off unless set
	keyRateLimit        rateSpec // KeyRateLimit; off unless set
	shutdownTimeout     time.Duration
	revokeTimeout       time.Duration
	retryBase           time.Duration
	retryMax            time.Duration

	maxAttempts    int
	attemptTimeout time.Duration
	stuckAfter     time.Duration
	hangLimit      time.Duration // HangLimit (hang.go); 0: off
	deadLetters    deadletter.Sink
	retryTopics    []time.Duration

	logger *slog.Logger
	hooks  []Hook

	batch bool // set by NewBatch

	// Outputs (outputs.go) and transactions (txn.go).
	outputs         bool
	exactlyOnce     bool
	transactionalID string

	// Backfill only (backfill.go): BackfillOpts.
	backfill         bool // set by Backfill
	readers          int
	progressFile     string
	progressInterval time.Duration
}

// Bits of cfg.explicit.
const (
	setCommitMetadataBytes = 1 << iota
	setRevokeTimeout
	setCommitBudget
	setCommitInterval
	setGroupProtocol
	setBatchSize
)

func defaultCfg() cfg {
	return cfg{
		concurrency:         64,
		ordering:            ByKey,
		batchSize:           100, // NewBatch only: New hands over one record at a time
		windowRecords:       1000,
		maxBytes:            64 << 20,
		commitInterval:      defaultCommitInterval,
		commitBudget:        defaultCommitBudget,
		commitMetadataBytes: offsetmeta.MaxBytes,
		shutdownTimeout:     30 * time.Second,
		revokeTimeout:       10 * time.Second,
		retryBase:           100 * time.Millisecond,
		retryMax:            10 * time.Second,
		maxAttempts:         3,
		rateLimit:           rateSpec{}, // off: starts are bounded by Concurrency alone
		keyRateLimit:        rateSpec{}, // off
		readers:             1,
		progressInterval:    time.Second,
		attemptTimeout:      30 * time.Second,
		hangLimit:           defaultHangLimit,
		logger:              slog.New(slog.DiscardHandler),
	}
}

// Brokers sets the seed brokers ("host:port"). Either Brokers or a
// ClientOptions carrying kgo.SeedBrokers is required, not both.
func Brokers(addrs ...string) Opt {
	return opt(func(c *cfg) { c.brokers = append(c.brokers, addrs...) })
}

// ClientOptions adds franz-go client options: TLS, SASL, client ID, fetch
// sizes, kgo.SeedBrokers and so on. kpar owns the group options (group,
// topics, commits, rebalance callbacks); setting them here is an error from
// New. kpar's own client defaults, which options given here override: the
// cooperative-sticky balancer, kgo.FetchMaxWait 25ms (a paused partition's
// resume waits for the fetch in flight), and fetch sizes derived from
// MaxBufferedBytes: kgo.FetchMaxBytes an eighth of it (at least 64 KiB, at
// most franz-go's 50 MiB), kgo.FetchMaxPartitionBytes a 128th of it (at
// least 64 KiB, at most franz-go's 1 MiB: small records weigh several
// times their wire size once decoded, see fetchsize.go), and
// kgo.MaxConcurrentFetches so that the fetches in flight or buffered make
// a quarter of it at most; kpar divides the first two by the compression
// ratio of the records it fetches, unless these options set them.
func ClientOptions(opts ...kgo.Opt) Opt {
	return opt(func(c *cfg) { c.clientOpts = append(c.clientOpts, opts...) })
}

// Group sets the consumer group: required by New (unless ShareGroup is
// given) and RunMembers. Backfill joins no group; there it only names the
// group in dead letters.
func Group(name string) Opt { return opt(func(c *cfg) { c.group = name }) }

// Topics sets the topics to consume. Required.
func Topics(topics ...string) GroupOpt {
	return groupOpt(func(c *cfg) { c.topics = append(c.topics, topics...) })
}

// TopicRegex makes the names given to Topics regular expressions: every
// matching topic is consumed, including ones created later.
func TopicRegex() GroupOpt { return groupOpt(func(c *cfg) { c.regex = true }) }

// Concurrency sets how many records (or batches) are handled at once,
// overriding the default 64. It is the size of the worker pool. While the
// handler takes under 20µs a record, no more workers than GOMAXPROCS are
// kept awake, besides any stuck for a millisecond in a handler: more could
// not run at once and would only queue at the engine's lock.
func Concurrency(n int) FlowOpt { return flowOpt(func(c *cfg) { c.concurrency = n }) }

// Ordering sets which records may be handled at the same time, overriding
// the default ByKey.
func Ordering(o Order) ConsumerOpt { return consumerOpt(func(c *cfg) { c.ordering = o }) }

// BatchSize sets the most records a BatchHandler receives at once,
// overriding the default 100. New, whose Handler takes one record at a
// time, refuses it. A batch holds records of one partition (and, in Key
// mode, of one key), in offset order.
func BatchSize(n int) ConsumerOpt {
	return consumerOpt(func(c *cfg) { c.batchSize, c.explicit = n, c.explicit|setBatchSize })
}

// WindowRecords bounds each partition's window: the records from the
// lowest unfinished offset through the newest fetched one, overriding the
// default 1000. Fetched records wait outside a full window, up to two of
// the partition's fetches (at least one window's worth, at most eight);
// beyond that the partition is paused. It also bounds the duplicates a
// crash can cause per partition.
func WindowRecords(n int) FlowOpt { return flowOpt(func(c *cfg) { c.windowRecords = n }) }

// MaxBufferedBytes bounds the key, value and header bytes of all records
// held across partitions, those in flight included, overriding the default
// 64 MiB. A record is admitted only while the bound is not reached, so the
// records held exceed it by one record at most, whatever their size (one
// larger than the bound is admitted alone); fetched records it has no room
// for wait, handed to nobody and their partition paused, until bytes free.
// A partition takes more than its share of the bound (the bound over the
// partitions) only while less than half of it is used, so records stuck in
// one partition leave half of it to the others; and while the bound is
// reached, the partitions holding more than their share are paused (until
// they hold half their share). The client's fetch sizes are derived from it
// (see ClientOptions). Records waiting on a retry timer are not counted:
// each partition's window bounds them. A share group member (ShareGroup)
// admits records the same way; those it has no room for stay acquired,
// their locks renewed, and it fetches again only once every record of its
// last fetch is acknowledged: it holds the bound plus one fetch at most.
func MaxBufferedBytes(n int64) FlowOpt { return flowOpt(func(c *cfg) { c.maxBytes = n }) }

// defaultCommitInterval is CommitInterval's default; see CommitInterval.
const defaultCommitInterval = 5 * time.Millisecond

// CommitInterval sets the least time between two commits, overriding the
// default 5ms. kpar commits as soon as a window start, or the set of
// finished records above it, moved; at most one commit is in flight, and
// nothing is committed while nothing finishes. A crash re-delivers the
// records in flight plus what finished within one interval (and the
// commit's round trip), so the interval trades broker requests for
// repeated work: at most 1/interval commits a second per member (200 by
// default, fewer when a commit's round trip is longer), only while records
// finish, none at idle. At 15,000 records a second, 5ms is 75 records;
// raise it for members that handle many records a second cheaply. kpar
// also commits on revoke and on shutdown. Not for ShareGroup, which
// acknowledges each record as it finishes (the client batches what it
// sends). Backfill saves its progress at its own pace (ProgressInterval).
func CommitInterval(d time.Duration) ConsumerOpt {
	return consumerOpt(func(c *cfg) { c.commitInterval, c.explicit = d, c.explicit|setCommitInterval })
}

// CommitMetadataBytes bounds the finished-offsets set that each commit
// carries in its metadata, overriding the default 4096 (Kafka's default
// offset.metadata.max.bytes). After a crash or rebalance the next owner
// skips the records in that set. A set that does not fit is cut to the
// lowest finished offsets that do (the rest is handled again); a broker
// that refuses the size makes kpar halve it. 0 commits plain offsets.
func CommitMetadataBytes(n int) ConsumerOpt {
	return consumerOpt(func(c *cfg) { c.commitMetadataBytes, c.explicit = n, c.explicit|setCommitMetadataBytes })
}

// AdaptiveConcurrency makes the number of attempts in flight adapt to the
// downstream, between 1 and Concurrency (the ceiling): it starts at 4 and
// grows while attempts succeed without their latency rising, and shrinks
// when the downstream pushes back (an error marked Overloaded, an attempt
// past AttemptTimeout, latency rising to twice its long-run level). At 1,
// continued overload pauses dispatching (10ms doubling to 5s) between
// probes; it then replaces the breaker that paces an overloaded downstream
// without it (see Overloaded). Records waiting for the limit stay in their
// window (fetching pauses as usual) and burn no attempts; an Overloaded
// failure does not count against MaxAttempts either. Consumer.ConcurrencyLimit reports the
// limit. Default: off (Concurrency attempts at most, always).
func AdaptiveConcurrency() FlowOpt { return flowOpt(func(c *cfg) { c.adaptive = true }) }

// RateLimit bounds how many handler attempts start per second across the
// Consumer, all partitions together: a token bucket of burst tokens that
// refills at perSecond. Records that wait for a token stay in their window
// (fetching pauses as usual), burn no attempt and are not retried; a retry
// is a start like any other. With NewBatch each record of a batch counts.
// perSecond must be above 0 and burst at least 1; a burst of 1 spaces
// starts evenly, a larger one lets that many go at once after a quiet
// spell. The drain after Run's context ends keeps to the limit too: the
// buffered records then take their time, bounded by ShutdownTimeout.
// Default: off.
func RateLimit(perSecond float64, burst int) FlowOpt {
	return flowOpt(func(c *cfg) { c.rateLimit = rateSpec{perSecond, burst, true} })
}

// KeyRateLimit bounds how many handler attempts start per second for each
// record key (the same bytes in any partition or topic), a token bucket per
// key like RateLimit's. A record whose key is out of tokens waits on a
// timer, not on a worker, while records of other keys go on; it burns no
// attempt. Records with a nil key are not limited by key. In ByKey mode the
// waiting record stays first of its key, so order holds; in ByPartition
// mode it is its partition's next record, so the partition waits with it;
// in Unordered mode the records of one key are spaced out, each keeping its
// place in the bucket's queue. With NewBatch the limit applies to each
// batch's first record (RateLimit counts every record).
//
// Memory is bounded: at most 65,536 keys have a bucket at once. A bucket
// that refilled equals a fresh one and is forgotten; past the bound, the
// least recently used key's bucket is forgotten first, and that key may
// then start up to burst records early. Default: off.
func KeyRateLimit(perSecond float64, burst int) FlowOpt {
	return flowOpt(func(c *cfg) { c.keyRateLimit = rateSpec{perSecond, burst, true} })
}

// InstanceID makes the consumer a static group member (KIP-345) with this
// group.instance.id. In the classic protocol a member that restarts with
// the same ID within the session timeout, after a clean stop or a crash,
// gets its partitions back at once, without a rebalance, instead of
// waiting for the session timeout to expire. In the consumer protocol
// that holds only after a clean stop: after a crash the broker answers the
// restarted member UNRELEASED_INSTANCE_ID until the dead member's session
// expires, as long as a dynamic member waits. Each running member needs
// its own ID (a second member with the same ID fences the first).
// Default: none (a dynamic member).
//
// With RunMembers, member i gets the ID "<id>-<i>".
func InstanceID(id string) GroupOpt { return groupOpt(func(c *cfg) { c.instanceID = id }) }

// ShutdownTimeout bounds how long Run drains buffered and in-flight records
// after its context is cancelled, overriding the default 30s. Past it,
// handler contexts are cancelled and what finished is committed.
func ShutdownTimeout(d time.Duration) Opt { return opt(func(c *cfg) { c.shutdownTimeout = d }) }

// RevokeTimeout bounds how long a rebalance waits for the in-flight records
// of revoked partitions before committing them, overriding the default 10s.
// Keep it below the group's rebalance timeout.
func RevokeTimeout(d time.Duration) ConsumerOpt {
	return consumerOpt(func(c *cfg) { c.revokeTimeout, c.explicit = d, c.explicit|setRevokeTimeout })
}

// RetryBackoff sets the exponential backoff between attempts of a failed
// record: full jitter over base*2^(attempt-1), capped at max, overriding
// the defaults 100ms and 10s.
func RetryBackoff(base, max time.Duration) Opt {
	return opt(func(c *cfg) { c.retryBase, c.retryMax = base, max })
}

// MaxAttempts sets how many times a record is tried locally before it goes
// to the next retry topic or the dead-letter sink, overriding the default 3.
// Without a dead-letter sink and retry topics, a record whose attempts are
// exhausted keeps being retried (at the capped backoff): kpar never skips a
// record it could not put somewhere durable.
func MaxAttempts(n int) FlowOpt { return flowOpt(func(c *cfg) { c.maxAttempts = n }) }

// AttemptTimeout bounds one handler attempt, overriding the default 30s.
// Past it the attempt's context is cancelled and the attempt counts as
// failed (class timeout); a handler that ignores its context keeps its
// worker until it returns.
func AttemptTimeout(d time.Duration) FlowOpt {
	return flowOpt(func(c *cfg) { c.attemptTimeout = d })
}

// StuckAfter sets how long a partition's window start may stay on one
// unfinished record before kpar reports it (log and HookRecordStuck),
// overriding the default of twice AttemptTimeout; 0 keeps that default.
func StuckAfter(d time.Duration) FlowOpt { return flowOpt(func(c *cfg) { c.stuckAfter = d }) }

// DeadLetters sets the sink that receives records kpar gives up on: a
// Permanent error, or attempts exhausted on the last retry topic. A record
// is finished (committable) only once the sink acknowledged it; while the
// sink fails, the record stays unfinished and its window start holds.
// Default: none (records are retried until they succeed).
func DeadLetters(s deadletter.Sink) FlowOpt {
	return flowOpt(func(c *cfg) { c.deadLetters = s })
}

// RetryTopics enables non-blocking retries through topics: a record whose
// local attempts are exhausted is produced to <topic>.retry.<n> (n from 1)
// with a due time delays[n-1] later, and consumed by the same Consumer no
// earlier than that, without holding back its original partition. After the
// last retry topic comes the dead-letter sink, and so does a record its
// retry topic refuses as too large (MESSAGE_TOO_LARGE), at once: no retry
// would make it fit. Default: none.
//
// A record sent to a retry topic leaves its key's (and partition's) order,
// as Spring Kafka's non-blocking retries do: the records after it go on,
// and it is handled again after its delay, most likely after them. Local
// retries (MaxAttempts) keep the order: a record retrying locally holds its
// key. Use local retries alone where order must hold through failures.
func RetryTopics(delays ...time.Duration) ConsumerOpt {
	return consumerOpt(func(c *cfg) { c.retryTopics = append([]time.Duration(nil), delays...) })
}

// WithLogger sets the logger, overriding the default that discards.
func WithLogger(l *slog.Logger) Opt { return opt(func(c *cfg) { c.logger = l }) }

// WithHooks adds hooks; see Hook. Each must implement at least one HookX
// interface.
func WithHooks(hooks ...Hook) Opt { return opt(func(c *cfg) { c.hooks = append(c.hooks, hooks...) }) }

// validate checks a consumer's configuration (New, NewBatch, RunMembers):
// membership, then the pipeline's flow rules (validateFlow).
func (c *cfg) validate() error {
	if c.shareGroup != "" {
		if err := c.validateShare(); err != nil {
			return err
		}
	}
	if err := c.validateOutputs(); err != nil {
		return err
	}
	switch {
	case c.group == "" && c.shareGroup == "":
		return fmt.Errorf("kpar: no group: set Group(name), or ShareGroup(name) for a share group")
	case len(c.topics) == 0:
		return fmt.Errorf("kpar: no topics: set Topics(names...)")
	case c.protocol < ClassicProtocol || c.protocol > ConsumerProtocol:
		return fmt.Errorf("kpar: GroupProtocol(%d) unknown: want ClassicProtocol or ConsumerProtocol", int(c.protocol))
	case c.ordering < ByKey || c.ordering > Unordered:
		return fmt.Errorf("kpar: Ordering(%d) unknown: want ByKey, ByPartition or Unordered", int(c.ordering))
	case c.batch && c.batchSize < 1:
		return fmt.Errorf("kpar: BatchSize(%d) out of range: want 1 or more", c.batchSize)
	case c.batch && c.windowRecords < c.batchSize && c.windowRecords >= 4:
		return fmt.Errorf("kpar: WindowRecords(%d) is smaller than BatchSize(%d): a batch must fit in the window", c.windowRecords, c.batchSize)
	case !(c.commitBudget >= 0) || math.IsInf(c.commitBudget, 1):
		return fmt.Errorf("kpar: CommitBudget(%v) out of range: want commits a second above 0, or 0 for no budget", c.commitBudget)
	case c.commitInterval <= 0:
		return fmt.Errorf("kpar: CommitInterval(%v) out of range: want more than 0", c.commitInterval)
	case c.commitMetadataBytes < 0 || c.commitMetadataBytes > 1<<20:
		return fmt.Errorf("kpar: CommitMetadataBytes(%d) out of range: want 0 (plain commits) to 1048576", c.commitMetadataBytes)
	case c.revokeTimeout <= 0:
		return fmt.Errorf("kpar: RevokeTimeout(%v) out of range: want more than 0", c.revokeTimeout)
	}
	if err := c.validatePairs(); err != nil {
		return err
	}
	if c.regex {
		for _, t := range c.topics {
			if _, err := regexp.Compile(t); err != nil {
				return fmt.Errorf("kpar: Topics(%q) with TopicRegex: %v", t, err)
			}
		}
	}
	for i, d := range c.retryTopics {
		if d <= 0 {
			return fmt.Errorf("kpar: RetryTopics delay %d is %v: want more than 0", i+1, d)
		}
	}
	return c.validateFlow()
}

// validateFlow checks what every source's pipeline shares (FlowOpt and
// Opt): Backfill checks it alone, with its range.
func (c *cfg) validateFlow() error {
	switch {
	case len(c.brokers) == 0 && len(c.clientOpts) == 0:
		return fmt.Errorf("kpar: no brokers: set Brokers(\"host:port\") or ClientOptions(kgo.SeedBrokers(...))")
	case c.concurrency < 1 || c.concurrency > 1<<16:
		return fmt.Errorf("kpar: Concurrency(%d) out of range: want 1 to 65536", c.concurrency)
	case c.windowRecords < 4 || c.windowRecords > 1<<24:
		return fmt.Errorf("kpar: WindowRecords(%d) out of range: want 4 to 16777216", c.windowRecords)
	case c.maxBytes < 1<<10:
		return fmt.Errorf("kpar: MaxBufferedBytes(%d) out of range: want 1024 or more", c.maxBytes)
	case c.shutdownTimeout <= 0:
		return fmt.Errorf("kpar: ShutdownTimeout(%v) out of range: want more than 0", c.shutdownTimeout)
	case c.retryBase <= 0 || c.retryMax < c.retryBase:
		return fmt.Errorf("kpar: RetryBackoff(%v, %v) out of range: want 0 < base <= max", c.retryBase, c.retryMax)
	case c.maxAttempts < 1:
		return fmt.Errorf("kpar: MaxAttempts(%d) out of range: want 1 or more", c.maxAttempts)
	case c.attemptTimeout <= 0:
		return fmt.Errorf("kpar: AttemptTimeout(%v) out of range: want more than 0", c.attemptTimeout)
	case c.hangLimit < 0:
		return fmt.Errorf("kpar: HangLimit(%v) out of range: want 0 (off) or more", c.hangLimit)
	case c.stuckAfter < 0:
		return fmt.Errorf("kpar: StuckAfter(%v) out of range: want 0 (twice AttemptTimeout) or more", c.stuckAfter)
	case c.logger == nil:
		return fmt.Errorf("kpar: WithLogger(nil): pass a logger, or leave the option out to discard logs")
	}
	if err := c.rateLimit.check("RateLimit"); err != nil {
		return err
	}
	if err := c.keyRateLimit.check("KeyRateLimit"); err != nil {
		return err
	}
	for i, h := range c.hooks {
		if !isHook(h) {
			return fmt.Errorf("kpar: WithHooks: hook %d (%T) implements no HookX interface", i, h)
		}
	}
	return c.validateClientOpts()
}

// validatePairs refuses options that each hold alone but not together
// (those with ShareGroup are validateShare's, those with ExactlyOnce
// validateOutputs'): each error names both.
func (c *cfg) validatePairs() error {
	switch {
	case c.regex && len(c.retryTopics) > 0:
		return errors.New("kpar: RetryTopics cannot be combined with TopicRegex: name the topics")
	case c.explicit&setBatchSize != 0 && !c.batch:
		return errors.New("kpar: BatchSize is for NewBatch: New's Handler takes one record at a time; leave BatchSize out, or use NewBatch with a BatchHandler")
	case c.transactionalID != "" && !c.exactlyOnce:
		return fmt.Errorf("kpar: TransactionalID(%q) without ExactlyOnce: only ExactlyOnce's producer is transactional; add ExactlyOnce or leave TransactionalID out", c.transactionalID)
	}
	return nil
}

// validateClientOpts builds (without connecting) a client from the user's
// options to reject those kpar must own.
func (c *cfg) validateClientOpts() error {
	if len(c.clientOpts) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(c.clientOpts...)
	if err != nil {
		return fmt.Errorf("kpar: ClientOptions: %w", err)
	}
	defer cl.Close()
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != "" {
		return fmt.Errorf("kpar: ClientOptions sets kgo.ConsumerGroup: use kpar.Group instead")
	}
	if g, _ := cl.OptValue(kgo.ShareGroup).(string); g != "" {
		return fmt.Errorf("kpar: ClientOptions sets kgo.ShareGroup: use kpar.ShareGroup instead")
	}
	if ts, _ := cl.OptValue(kgo.ConsumeTopics).([]string); len(ts) > 0 {
		return fmt.Errorf("kpar: ClientOptions sets kgo.ConsumeTopics: use kpar.Topics instead")
	}
	seeds, _ := cl.OptValue(kgo.SeedBrokers).([]string)
	defaultSeeds := len(seeds) == 1 && seeds[0] == "127.0.0.1"
	switch {
	case len(c.brokers) > 0 && !defaultSeeds:
		return fmt.Errorf("kpar: both Brokers and ClientOptions(kgo.SeedBrokers) given: keep one")
	case len(c.brokers) == 0 && defaultSeeds:
		return fmt.Errorf("kpar: no brokers: set Brokers(\"host:port\") or ClientOptions(kgo.SeedBrokers(...))")
	}
	return nil
}
