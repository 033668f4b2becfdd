package main

import (
	"context"
	"encoding/binary"
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
				raw := p.RecordBatches
				var lines []string
				for i := 0; len(raw) >= 12 && i < n; i++ {
					l := int(binary.BigEndian.Uint32(raw[8:12]))
					if 12+l > len(raw) {
						break
					}
					var b kmsg.RecordBatch
					if err := b.ReadFrom(raw[:12+l]); err != nil {
						break
					}
					raw = raw[12+l:]
					kind := "data"
					if b.Attributes&0x20 != 0 {
						kind = "control"
						kind += fmt.Sprintf("(%s)", controlType(b))
					} else if b.Attributes&0x10 != 0 {
						kind = "txn-data"
					}
					lines = append(lines, fmt.Sprintf("%d+%d %s pid %d e%d", b.FirstOffset, b.LastOffsetDelta+1, kind, b.ProducerID, b.ProducerEpoch))
				}
				t.Logf("dump %s/%d from %d:\n  %s", topic, partition, from, strings.Join(lines, "\n  "))
			}
		}
	}
}

// controlType reads the marker of a control batch: its one record's key
// is a version (2 bytes) and a type (2 bytes: 0 ABORT, 1 COMMIT).
func controlType(b kmsg.RecordBatch) string {
	r := kmsg.NewRecord()
	if err := r.ReadFrom(b.Records); err != nil || len(r.Key) < 4 {
		return "?"
	}
	switch r.Key[3] {
	case 0:
		return "ABORT"
	case 1:
		return "COMMIT"
	}
	return "?"
}
