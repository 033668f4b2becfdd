package kpar

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ShareGroup makes the Consumer a member of the share group name (KIP-932,
// Kafka 4.2+) instead of a consumer group: the broker hands the records of
// each partition to every member of the group and tracks each record by
// itself, so members are not limited by the partition count. It replaces
// Group (giving both is an error).
//
// Records go through the same pipeline as a consumer group's, and every
// flow rule holds as it does there: Concurrency, the Handler or
// BatchHandler, AdaptiveConcurrency, RateLimit and KeyRateLimit,
// MaxAttempts, RetryBackoff, AttemptTimeout, Permanent, Overloaded (an
// overloaded downstream burns no attempt; the breaker or the adaptive limit
// paces it), RetryAfter, StuckAfter, DeadLetters, the hooks and
// ShutdownTimeout. WindowRecords and MaxBufferedBytes bound what this member
// holds per partition and in all. Each outcome becomes an acknowledgement
// as the record finishes (the client sends them with its next fetch):
//
//   - success: ACCEPT.
//   - a failed attempt: retried here, with kpar's backoff, while the record
//     stays acquired by this member; kpar RENEWs the broker's acquisition
//     lock (KIP-1222) while a record runs or waits, so a RELEASE, which the
//     broker redelivers at once and counts against its delivery limit, is
//     never how kpar retries.
//   - Permanent, or MaxAttempts used up: written to the DeadLetters sink
//     first and ACCEPTed only once the sink acknowledged it; while the sink
//     fails the record stays acquired and unacknowledged. Without a sink, a
//     record is retried until it succeeds.
//   - shutdown: records not started are RELEASEd for other members, but
//     those on their last delivery (the broker's
//     group.share.delivery.count.limit), which a RELEASE would make the
//     broker archive unseen: they are run. Running records finish within
//     ShutdownTimeout; what is left then is RELEASEd (a record on its last
//     delivery among them is archived by the broker, and kpar logs it).
//
// Share groups order nothing across members. ByKey (the default) means at
// most one record per key of a partition at a time within this Consumer:
// records of one key run one after the other here, but other members may
// run other records of that key at the same time. Unordered runs anything.
// ByPartition is refused: a share group spreads a partition over its
// members. So are RetryTopics (retries stay local, then go to DeadLetters),
// InstanceID (share groups have no static membership), and the options
// that only a consumer group's commits use, CommitMetadataBytes and
// RevokeTimeout, when given.
//
// franz-go accepts, at the next poll, every record of a poll that has no
// final acknowledgement yet; kpar therefore polls again only when every
// record of the last poll (up to twice Concurrency records, times
// BatchSize with NewBatch) is acknowledged. A record waiting for its retry
// holds back this member's next poll, not the group's: other members go
// on.
//
// A share group reads from the newest record unless its
// share.auto.offset.reset says otherwise; when that config is not set,
// kpar sets it to earliest at start, as a consumer group starts at the
// oldest record (it logs instead if it may not alter the group's config).
//
// Consumer.ShareStats reports what the member holds and how its records
// were acknowledged; Consumer.Partitions returns nil in this mode.
func ShareGroup(name string) ConsumerOpt {
	return consumerOpt(func(c *cfg) { c.shareGroup = name })
}

// ShareStats is a snapshot of a Consumer running with ShareGroup. The
// counters count from the start of the current (or last) Run.
type ShareStats struct {
	Group string
	// Running is true from the moment Run has a client that reached the
	// brokers until its shutdown begins.
	Running bool
	// Acquired counts the records this member holds: polled and not
	// acknowledged yet (queued, running, waiting for a retry, or waiting
	// for the dead-letter sink).
	Acquired int
	// InFlight counts the records a handler runs now.
	InFlight int
	// Retrying counts acquired records waiting for their retry backoff.
	Retrying int
	// Polls counts polls that returned records.
	Polls int64
	// Received counts the records polled; Redelivered those among them
	// the broker had delivered before (delivery count above 1).
	Received, Redelivered int64
	// MaxDeliveryCount is the highest delivery count among the records
	// polled; DeliveryLimit the broker's limit as read at start (5,
	// Kafka's default, when it could not be read).
	MaxDeliveryCount, DeliveryLimit int32
	// Accepted counts ACCEPT acknowledgements: records handled, and the
	// DeadLettered records, accepted after the sink acknowledged them.
	Accepted, DeadLettered int64
	// Released counts RELEASE acknowledgements: records handed back at
	// shutdown.
	Released int64
	// Renewed counts lock renewals (RENEW acknowledgements) sent.
	Renewed int64
	// AckErrors counts partitions whose acknowledgements the broker (or
	// the client) reported failed: their records are delivered again.
	AckErrors int64
}

// ShareStats returns a snapshot of the share-group member (zero counters
// before the first Run), and false when the Consumer is not configured
// with ShareGroup.
func (c *Consumer) ShareStats() (ShareStats, bool) {
	if c.cfg.shareGroup == "" {
		return ShareStats{}, false
	}
	c.mu.Lock()
	s := c.share
	c.mu.Unlock()
	if s == nil {
		return ShareStats{Group: c.cfg.shareGroup}, true
	}
	return s.snapshot(), true
}

// validateShare checks the options that a share group does not support.
func (c *cfg) validateShare() error {
	switch {
	case c.group != "":
		return errors.New("kpar: both Group and ShareGroup given: a Consumer is a member of one consumer group or one share group; keep one")
	case c.ordering == ByPartition:
		return errors.New("kpar: Ordering(ByPartition) cannot be kept with ShareGroup: a share group hands one partition's records to many members at once: use ByKey (one record per key at a time in this Consumer) or Unordered, or Group for per-partition order")
	case len(c.retryTopics) > 0:
		return errors.New("kpar: RetryTopics is not supported with ShareGroup: failed records are retried while this member holds them (MaxAttempts, RetryBackoff), then go to DeadLetters; use Group for retry topics")
	case c.instanceID != "":
		return errors.New("kpar: InstanceID is not supported with ShareGroup: share groups have no static membership; leave it out")
	case c.explicit&setCommitMetadataBytes != 0:
		return errors.New("kpar: CommitMetadataBytes is not supported with ShareGroup: a share group commits no offsets, each record is acknowledged; leave it out")
	case c.explicit&setCommitInterval != 0:
		return errors.New("kpar: CommitInterval is not supported with ShareGroup: a share group commits no offsets, each record is acknowledged as it finishes (the client batches what it sends); leave it out")
	case c.explicit&setCommitBudget != 0:
		return errors.New("kpar: CommitBudget is not supported with ShareGroup: a share group commits no offsets, each record is acknowledged; leave it out")
	case c.explicit&setGroupProtocol != 0:
		return fmt.Errorf("kpar: GroupProtocol(%v) is not supported with ShareGroup: a share group's broker assigns its records, there is no consumer-group rebalance protocol to choose; leave it out", c.protocol)
	case c.explicit&setRevokeTimeout != 0:
		return errors.New("kpar: RevokeTimeout is not supported with ShareGroup: share groups revoke no partitions, records go back when their locks expire; leave it out")
	}
	return nil
}

// Share-group configs kpar reads at start.
const (
	shareAutoOffsetReset  = "share.auto.offset.reset"
	shareDeliveryLimit    = "share.delivery.count.limit"       // group level (Kafka 4.1+)
	brokerShareDeliveries = "group.share.delivery.count.limit" // broker level
)

// prepareGroup reads the group's delivery-count limit (the group's own
// config, else the broker's) and, when the group has no
// share.auto.offset.reset of its own, sets it to earliest. Both are best
// effort: a broker that refuses leaves Kafka's defaults.
func (s *shareSource) prepareGroup(ctx context.Context, cl *kgo.Client) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	rr.ResourceName = s.cfg.shareGroup
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	groupLimit, resetSet := "", false
	if err == nil && len(resp.Resources) == 1 && resp.Resources[0].ErrorCode == 0 {
		for _, c := range resp.Resources[0].Configs {
			dynamic := c.Source == kmsg.ConfigSourceGroupConfig
			switch c.Name {
			case shareAutoOffsetReset:
				resetSet = dynamic
			case shareDeliveryLimit:
				if dynamic && c.Value != nil {
					groupLimit = *c.Value
				}
			}
		}
	} else {
		if err == nil && len(resp.Resources) == 1 {
			err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
		}
		s.log.Warn("kpar: cannot read the share group's configs; assuming the broker's defaults", "share_group", s.cfg.shareGroup, "err", err)
		resetSet = true // do not overwrite what we could not read
	}
	if groupLimit == "" {
		if bcs, err := kadm.NewClient(cl).DescribeBrokerConfigs(ctx); err == nil {
			for _, rc := range bcs {
				for _, c := range rc.Configs {
					if c.Key == brokerShareDeliveries && c.Value != nil {
						groupLimit = *c.Value
					}
				}
			}
		}
	}
	if n, err := strconv.Atoi(groupLimit); err == nil && n > 0 {
		s.limit.Store(int32(n))
	}
	if resetSet {
		return
	}
	alter := kmsg.NewPtrIncrementalAlterConfigsRequest()
	ar := kmsg.NewIncrementalAlterConfigsRequestResource()
	ar.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	ar.ResourceName = s.cfg.shareGroup
	ac := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	ac.Name = shareAutoOffsetReset
	ac.Op = kmsg.IncrementalAlterConfigOpSet
	ac.Value = kmsg.StringPtr("earliest")
	ar.Configs = append(ar.Configs, ac)
	alter.Resources = append(alter.Resources, ar)
	aresp, err := alter.RequestWith(ctx, cl)
	if err == nil && len(aresp.Resources) == 1 {
		err = kerr.ErrorForCode(aresp.Resources[0].ErrorCode)
	}
	if err != nil {
		s.log.Warn("kpar: cannot set share.auto.offset.reset=earliest on the share group; it starts at the newest records (set it with kafka-configs --entity-type groups)",
			"share_group", s.cfg.shareGroup, "err", err)
		return
	}
	s.log.Info("kpar: share group had no share.auto.offset.reset; set it to earliest", "share_group", s.cfg.shareGroup)
}

// letterGroup names the group in dead letters: the consumer group, or the
// share group.
func (c *cfg) letterGroup() string {
	if c.shareGroup != "" {
		return c.shareGroup
	}
	return c.group
}
