package testkit

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CommitOffsetsInTxn adds to the open transaction of cl, whose
// transactional ID is txnID, the commit of group's offsets of topic (a
// partition each, with metadata meta): AddOffsetsToTxn then
// TxnOffsetCommit, as a consumer-producer does. The commit lands when the
// transaction commits. It commits as no member (generation -1): the tests
// stage a dead predecessor's transaction, or one that kpar broker is
// killed in the middle of.
func CommitOffsetsInTxn(ctx context.Context, cl *kgo.Client, txnID, group, topic string, offsets map[int32]int64, meta *string) error {
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return err
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txnID, id, epoch, group
	addResp, err := add.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("AddOffsetsToTxn: %w", err)
	}
	tds, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err == nil {
		err = tds.Error()
	}
	if err != nil {
		return fmt.Errorf("the ID of topic %s: %w", topic, err)
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch, req.Generation = txnID, group, id, epoch, -1
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = topic, tds[topic].ID // v6+ names a topic by its ID
	for p, at := range offsets {
		rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = p, at, -1, meta
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("TxnOffsetCommit: %w", err)
	}
	var errs []error
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				errs = append(errs, fmt.Errorf("TxnOffsetCommit %s/%d: %w", t.Topic, p.Partition, err))
			}
		}
	}
	return errors.Join(errs...)
}
