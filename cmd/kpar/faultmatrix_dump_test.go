package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
)

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
					l := int(uint32(raw[8])<<24 | uint32(raw[9])<<16 | uint32(raw[10])<<8 | uint32(raw[11]))
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
						// the control record's key: version(2) type(2)
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

// controlType reads the marker type of an uncompressed control batch.
func controlType(b kmsg.RecordBatch) string {
	recs := b.Records
	// one record: length(varint) attrs(1) tsDelta(varint) offDelta(varint) keyLen(varint) key...
	r := kmsg.NewRecord()
	if err := r.ReadFrom(recs); err != nil || len(r.Key) < 4 {
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
