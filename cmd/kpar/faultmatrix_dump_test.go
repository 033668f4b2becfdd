package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// logRepeatedReplies logs where the first copies of replies read more than
// once are (partition, offset, producer and epoch), and the batches around
// the first, as the broker stores them: which transaction repeated them,
// and how it ended.
func logRepeatedReplies(ctx context.Context, t *testing.T, addr string, replies []*kgo.Record) {
	copies := map[string][]*kgo.Record{}
	var repeated []string
	for _, r := range replies {
		v := string(r.Value)
		if copies[v] = append(copies[v], r); len(copies[v]) == 2 {
			repeated = append(repeated, v)
		}
	}
	for i, v := range repeated[:min(len(repeated), 5)] {
		var where []string
		for _, r := range copies[v] {
			where = append(where, fmt.Sprintf("%d@%d (producer %d epoch %d)", r.Partition, r.Offset, r.ProducerID, r.ProducerEpoch))
		}
		t.Logf("%q read_committed %d times: %v", v, len(where), where)
		if i == 0 {
			first := copies[v][0]
			dumpBatches(ctx, t, addr, "replies", first.Partition, max(first.Offset-40, 0), 60)
		}
	}
}

// dumpBatches logs the record batches of topic/partition from offset
// from, for n batches, as the broker stores them: producer, epoch,
// whether transactional, and control markers (ABORT/COMMIT); and the
// aborted transactions a read_committed fetch from there is told of.
func dumpBatches(ctx context.Context, t *testing.T, addr, topic string, partition int32, from int64, n int) {
	cl := newClient(t, addr)
	defer cl.Close()
	tds, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		t.Logf("dump: %v", err)
		return
	}
	id := tds[topic].ID
	for _, iso := range []int8{0, 1} {
		req := kmsg.NewPtrFetchRequest()
		req.MaxWaitMillis, req.MaxBytes, req.IsolationLevel = 100, 10<<20, iso
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = topic, id
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = partition, from, 10<<20
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Logf("dump fetch: %v", err)
			return
		}
		for _, rt := range resp.Topics {
			for _, p := range rt.Partitions {
				if p.ErrorCode != 0 {
					t.Logf("dump: fetch error %d", p.ErrorCode)
				}
				if iso == 1 {
					var ab []string
					for _, a := range p.AbortedTransactions {
						ab = append(ab, fmt.Sprintf("%d@%d", a.ProducerID, a.FirstOffset))
					}
					t.Logf("dump %s/%d from %d: LSO %d HWM %d aborted %v", topic, partition, from, p.LastStableOffset, p.HighWatermark, ab)
					continue
				}
				var lines []string
				eachBatch(p.RecordBatches, func(b kmsg.RecordBatch) bool {
					kind := "data"
					switch commit, ok := markerType(b); {
					case b.Attributes&batchControl == 0:
						if b.Attributes&batchTransactional != 0 {
							kind = "txn-data"
						}
					case !ok:
						kind = "control(?)"
					case commit:
						kind = "control(COMMIT)"
					default:
						kind = "control(ABORT)"
					}
					lines = append(lines, fmt.Sprintf("%d+%d %s pid %d e%d", b.FirstOffset, b.LastOffsetDelta+1, kind, b.ProducerID, b.ProducerEpoch))
					return len(lines) < n
				})
				t.Logf("dump %s/%d from %d:\n  %s", topic, partition, from, strings.Join(lines, "\n  "))
			}
		}
	}
}
