package kpar

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// openPredecessorTxn leaves, as a member killed mid-transaction does, an
// open transaction of txnID holding an output record and an offset commit
// of group: until it ends, the broker answers the group's offset fetches
// UNSTABLE_OFFSET_COMMIT (KIP-447). The transaction times out after
// timeout.
func openPredecessorTxn(t *testing.T, addrs []string, txnID, group, topic string, timeout time.Duration) {
	t.Helper()
	ctx := t.Context()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.TransactionalID(txnID), kgo.TransactionTimeout(timeout),
		kgo.DefaultProduceTopic("out"), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close) // the killed process: it never ends its transaction
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("predecessor's output")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txnID, id, epoch, group
	addResp, err := add.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("AddOffsetsToTxn: %v", err)
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch, req.Generation = txnID, group, id, epoch, -1
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	metaResp, err := meta.RequestWith(ctx, cl)
	if err != nil || len(metaResp.Topics) != 1 {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = topic, metaResp.Topics[0].TopicID // v6+ names a topic by its ID
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.LeaderEpoch = 0, 1, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				err = kerr.ErrorForCode(p.ErrorCode)
			}
		}
	}
	if err != nil {
		t.Fatalf("TxnOffsetCommit: %v", err)
	}
}

// TestExactlyOnceRestartEndsThePredecessorsTransactionAtOnce: a member
// restarted with its transactional ID after a kill -9 in the middle of a
// transaction that held an offset commit handles records at once. It
// waited out the predecessor's transaction timeout (franz-go's default
// 40s; 1 restart in 60 of the probe stalled ~40 s, silently): the group's
// offset fetch answers UNSTABLE_OFFSET_COMMIT until that transaction ends,
// and nothing ended it before the member's first own transaction, which
// waited for records.
func TestExactlyOnceRestartEndsThePredecessorsTransactionAtOnce(t *testing.T) {
	const topic, group, n = "in", "eos-restart", 10
	c := newFakeCluster(t, "leaves a transaction open", topic, 1)
	produce(t, c, topic, n, 2)
	openPredecessorTxn(t, c.ListenAddrs(), group+"-m1", group, topic, 45*time.Second)

	var handled atomic.Int64
	first := make(chan struct{})
	h := HandlerFunc(func(context.Context, *kgo.Record) error {
		if handled.Add(1) == 1 {
			close(first)
		}
		return nil
	})
	cons, err := New(h, append(testOpts(c, group, topic), ExactlyOnce(), InstanceID("m1"))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, cons)
	// Well below the predecessor's 45s timeout: a restart must not wait
	// for it.
	waitFor(t, first, 20*time.Second, "the first record after the restart")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
