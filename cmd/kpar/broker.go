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
	fs := newFlagSet("broker", `

Runs a Kafka-compatible development broker (franz-go's kfake) on a loopback
address until SIGINT or SIGTERM. Topics are created on first use. Without
--data-dir everything is kept in memory and lost on exit. With --data-dir,
topics, records and committed group offsets survive a restart, also after a
kill -9 (not a power loss: nothing is fsynced per write). Share groups
(KIP-932) work too: a consumer's acquisition lock lasts --share-lock-duration
and the broker archives a record after --share-delivery-limit deliveries. As
in Kafka, a share group starts at the newest record unless the group's
share.auto.offset.reset is earliest; kpar forward --share-group sets that on
a group that has none. Consumer groups of the consumer protocol (KIP-848,
kpar forward --group-protocol consumer) get their session timeout and
heartbeat interval from the broker: --consumer-session-timeout and
--consumer-heartbeat-interval.

Share groups and --data-dir: the broker saves a share group's progress
(which records were acknowledged) only when it stops on SIGINT or SIGTERM.
After a kill -9 or a crash it is lost, so kpar broker refuses to start on
that directory (exit 1, naming the groups) rather than let their members
silently skip records; --forget-share-groups starts it anyway, the groups
afresh.`, stderr)
	listen := fs.String("listen", "127.0.0.1:9092", "loopback `host:port` to listen on; port 0 picks a free port")
	partitions := fs.Int("partitions", 8, "partitions of each auto-created topic")
	dataDir := fs.String("data-dir", "", "keep topics, records and group offsets in `DIR` across restarts (default in memory)")
	lock := fs.Duration("share-lock-duration", 30*time.Second, "how long a share-group member holds a record it did not acknowledge (group.share.record.lock.duration.ms; at least 1s); short ones make tests fast")
	deliveries := fs.Int("share-delivery-limit", 5, "deliveries of a share-group record before the broker archives it (group.share.delivery.count.limit, 2 to 10)")
	session := fs.Duration("consumer-session-timeout", 45*time.Second, "how long a consumer-protocol group waits for a silent member before moving its partitions (group.consumer.session.timeout.ms; Kafka's default); --session-timeout of kpar forward does not apply in that protocol")
	forgetShare := fs.Bool("forget-share-groups", false, "start on a --data-dir whose broker served share groups and did not stop cleanly (kill -9, a crash), dropping those groups: they start afresh (by default kpar broker refuses, since their progress is lost)")
	heartbeat := fs.Duration("consumer-heartbeat-interval", time.Second, "how often consumer-protocol members heartbeat, and so how soon they learn a new assignment (group.consumer.heartbeat.interval.ms; Kafka's default is 5s)")
	registry := addBrokerRegistryFlag(fs) // broker_registry.go
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return fs.usageError("unexpected argument %q", fs.Arg(0))
	}
	addr, err := embedded.ListenAddr(*listen)
	if err != nil {
		return fs.usageError("invalid --listen: %v", err)
	}
	if *partitions < 1 {
		return fs.usageError("invalid --partitions %d: must be at least 1", *partitions)
	}
	if *lock < time.Second || *lock > time.Hour {
		return fs.usageError("invalid --share-lock-duration %v: want 1s to 1h (clients treat a shorter lock as 1s)", *lock)
	}
	if *session < time.Second || *session > 30*time.Minute {
		return fs.usageError("invalid --consumer-session-timeout %v: want 1s to 30m", *session)
	}
	if *heartbeat < 100*time.Millisecond || *heartbeat >= *session {
		return fs.usageError("invalid --consumer-heartbeat-interval %v: want 100ms or more, below --consumer-session-timeout (%v)", *heartbeat, *session)
	}
	if *forgetShare && *dataDir == "" {
		return fs.usageError("invalid --forget-share-groups: it needs --data-dir")
	}
	if *deliveries < 2 || *deliveries > 10 {
		return fs.usageError("invalid --share-delivery-limit %d: want 2 to 10, as Kafka allows", *deliveries)
	}

	var guard *shareGuard // broker_share.go
	if *dataDir != "" {
		if guard, err = guardShareGroups(*dataDir, *forgetShare, stderr); err != nil {
			fmt.Fprintf(stderr, "kpar broker: %v\n", err)
			return 1
		}
	}
	c, err := embedded.Start(embedded.Config{
		Addr:       addr,
		Partitions: *partitions,
		DataDir:    *dataDir,
		Opts: []kfake.Opt{
			kfake.WithLogger(kfake.BasicLogger(stderr, kfake.LogLevelWarn)),
			kfake.BrokerConfigs(map[string]string{
				"group.share.record.lock.duration.ms": strconv.FormatInt(lock.Milliseconds(), 10),
				// Expired locks are found by a sweep: a tenth of the
				// lock (kfake's default is 5s, longer than short locks).
				"share.record.lock.sweep.interval.ms":  strconv.FormatInt(max(lock.Milliseconds()/10, 100), 10),
				"group.share.delivery.count.limit":     strconv.Itoa(*deliveries),
				"group.consumer.session.timeout.ms":    strconv.FormatInt(session.Milliseconds(), 10),
				"group.consumer.heartbeat.interval.ms": strconv.FormatInt(heartbeat.Milliseconds(), 10),
			}),
		},
	})
	if err != nil {
		fmt.Fprintf(stderr, "kpar broker: %v\n", err)
		return 1
	}
	if guard != nil {
		guard.watch(c.Cluster)
	}
	fmt.Fprintf(stdout, "kpar broker listening on %s\n", c.Addr())
	if *registry != "" {
		stop, err := serveRegistry(*registry, stdout)
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
