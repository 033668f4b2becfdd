package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kpar/kpar/cmd/kpar/internal/embedded"
)

// cmdBroker runs a single Kafka-compatible broker (franz-go's kfake) on a
// loopback address until ctx is cancelled. It prints one line to stdout,
// "kpar broker listening on ADDR", once the broker accepts connections, so a
// script or test can wait for that line and read the real address from it.
func cmdBroker(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	b, code, ok := parseBroker(args, stderr)
	if !ok {
		return code
	}
	var guard *shareGuard // broker_share.go
	var err error
	if *b.dataDir != "" {
		if guard, err = guardShareGroups(*b.dataDir, *b.forgetShare, stderr); err != nil {
			fmt.Fprintf(stderr, "kpar broker: %v\n", err)
			return 1
		}
		if err := repairTransactions(ctx, b.config(stderr), stderr); err != nil { // broker_txn.go
			fmt.Fprintf(stderr, "kpar broker: %v\n", err)
			return 1
		}
	}
	c, err := embedded.Start(b.config(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "kpar broker: %v\n", err)
		return 1
	}
	if guard != nil {
		guard.watch(c.Cluster)
	}
	fmt.Fprintf(stdout, "kpar broker listening on %s\n", c.Addr())
	if *b.registry != "" {
		stop, err := serveRegistry(*b.registry, stdout)
		if err != nil {
			c.Close()
			fmt.Fprintf(stderr, "kpar broker: --schema-registry: %v\n", err)
			return 1
		}
		defer stop()
	}

	<-ctx.Done()
	// With --data-dir, Close saves what kfake only writes at shutdown
	// (partition snapshots, group members, share groups' progress) and
	// closes the files.
	c.Close()
	if guard != nil {
		if err := guard.stopped(); err != nil {
			fmt.Fprintf(stderr, "kpar broker: noting the clean stop in %s: %v; the next start will refuse the share groups (--forget-share-groups)\n", guard.path, err)
			return 1
		}
	}
	return 0
}

// brokerUsage is kpar broker's synopsis and description.
const brokerUsage = `

Runs a Kafka-compatible development broker (franz-go's kfake) on a loopback
address until SIGINT or SIGTERM. Topics are created on first use. Without
--data-dir everything is kept in memory and lost on exit. With --data-dir,
topics, records and committed group offsets survive a restart, also after a
kill -9 (not a power loss: nothing is fsynced per write). Share groups
(KIP-932) work too: a consumer's acquisition lock lasts --share-lock-duration
and the broker archives a record after --share-delivery-limit deliveries. A
member that stops without leaving (kill -9) keeps its partitions until its
share session expires (--share-session-timeout), and the records it acquired
until then or until their locks expire. As in Kafka, a share group starts at
the newest record unless the group's share.auto.offset.reset is earliest;
kpar forward --share-group sets that on a group that has none. Consumer
groups of the consumer protocol (KIP-848, kpar forward --group-protocol
consumer) get their session timeout and heartbeat interval from the broker:
--consumer-session-timeout and --consumer-heartbeat-interval. Group members
are saved only on a clean stop: after a kill -9 the broker has forgotten
them, their commits are refused (UNKNOWN_MEMBER_ID) and they rejoin from the
last commit that landed.

Share groups and --data-dir: the broker saves a share group's progress
(which records were acknowledged) only when it stops on SIGINT or SIGTERM.
After a kill -9 or a crash it is lost, so kpar broker refuses to start on
that directory (exit 1, naming the groups) rather than let their members
silently skip records; --forget-share-groups starts it anyway, the groups
afresh.

Transactions and --data-dir: after a kill -9 or a crash, the transactions
that were open are aborted when the broker starts again (it writes their
ABORT markers and says so on stderr); their producers are fenced and retry
in a new transaction. A transaction whose COMMIT markers were written but
not its offset commits (kfake writes them after the markers) gets them from
a journal the broker keeps (kpar-txn-offsets.json). One cut between two of
its markers stays half committed, and says so: its inputs are handled
again. After a clean stop open transactions stay open for their producers
to end.`

// brokerFlags are kpar broker's flags.
type brokerFlags struct {
	listen, dataDir, registry *string
	partitions, deliveries    *int
	lock, session, heartbeat  *time.Duration
	forgetShare               *bool
	share                     shareSessionFlags // broker_share.go
	addr                      string            // --listen, checked
}

// parseBroker defines kpar broker's flags, parses args and checks them.
func parseBroker(args []string, stderr io.Writer) (*brokerFlags, int, bool) {
	fs := newFlagSet("broker", brokerUsage, stderr)
	b := &brokerFlags{
		listen:      fs.String("listen", "127.0.0.1:9092", "loopback `host:port` to listen on; port 0 picks a free port"),
		partitions:  fs.Int("partitions", 8, "partitions of each auto-created topic"),
		dataDir:     fs.String("data-dir", "", "keep topics, records and group offsets in `DIR` across restarts (default in memory)"),
		lock:        fs.Duration("share-lock-duration", 30*time.Second, "how long a share-group member holds a record it did not acknowledge (group.share.record.lock.duration.ms; at least 1s); short ones make tests fast"),
		deliveries:  fs.Int("share-delivery-limit", 5, "deliveries of a share-group record before the broker archives it (group.share.delivery.count.limit, 2 to 10)"),
		session:     fs.Duration("consumer-session-timeout", 45*time.Second, "how long a consumer-protocol group waits for a silent member before moving its partitions (group.consumer.session.timeout.ms; Kafka's default); --session-timeout of kpar forward does not apply in that protocol"),
		forgetShare: fs.Bool("forget-share-groups", false, "start on a --data-dir whose broker served share groups and did not stop cleanly (kill -9, a crash), dropping those groups: they start afresh (by default kpar broker refuses, since their progress is lost)"),
		heartbeat:   fs.Duration("consumer-heartbeat-interval", time.Second, "how often consumer-protocol members heartbeat, and so how soon they learn a new assignment (group.consumer.heartbeat.interval.ms; Kafka's default is 5s)"),
		registry:    addBrokerRegistryFlag(fs), // broker_registry.go
		share:       addShareSessionFlags(fs),
	}
	if code, ok := fs.parseArgs(args); !ok {
		return nil, code, false
	}
	addr, err := embedded.ListenAddr(*b.listen)
	if err != nil {
		return nil, fs.usageError("invalid --listen: %v", err), false
	}
	b.addr = addr
	switch {
	case *b.partitions < 1:
		return nil, fs.usageError("invalid --partitions %d: must be at least 1", *b.partitions), false
	case *b.lock < time.Second || *b.lock > time.Hour:
		return nil, fs.usageError("invalid --share-lock-duration %v: want 1s to 1h (clients treat a shorter lock as 1s)", *b.lock), false
	case *b.session < time.Second || *b.session > 30*time.Minute:
		return nil, fs.usageError("invalid --consumer-session-timeout %v: want 1s to 30m", *b.session), false
	case *b.heartbeat < 100*time.Millisecond || *b.heartbeat >= *b.session:
		return nil, fs.usageError("invalid --consumer-heartbeat-interval %v: want 100ms or more, below --consumer-session-timeout (%v)", *b.heartbeat, *b.session), false
	case *b.forgetShare && *b.dataDir == "":
		return nil, fs.usageError("invalid --forget-share-groups: it needs --data-dir"), false
	case *b.deliveries < 2 || *b.deliveries > 10:
		return nil, fs.usageError("invalid --share-delivery-limit %d: want 2 to 10, as Kafka allows", *b.deliveries), false
	case b.share.check() != "":
		return nil, fs.usageError("%s", b.share.check()), false
	}
	return b, 0, true
}

// config is the embedded broker the flags ask for.
func (b *brokerFlags) config(stderr io.Writer) embedded.Config {
	lock := *b.lock
	return embedded.Config{
		Addr:       b.addr,
		Partitions: *b.partitions,
		DataDir:    *b.dataDir,
		Opts: []kfake.Opt{
			kfake.WithLogger(kfake.BasicLogger(stderr, kfake.LogLevelWarn)),
			kfake.BrokerConfigs(b.share.configs(map[string]string{
				"group.share.record.lock.duration.ms": strconv.FormatInt(lock.Milliseconds(), 10),
				// Expired locks are found by a sweep: a tenth of the
				// lock (kfake's default is 5s, longer than short locks).
				"share.record.lock.sweep.interval.ms":  strconv.FormatInt(max(lock.Milliseconds()/10, 100), 10),
				"group.share.delivery.count.limit":     strconv.Itoa(*b.deliveries),
				"group.consumer.session.timeout.ms":    strconv.FormatInt(b.session.Milliseconds(), 10),
				"group.consumer.heartbeat.interval.ms": strconv.FormatInt(b.heartbeat.Milliseconds(), 10),
			})),
		},
	}
}
