package kpar

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Headers of records in retry topics. The original record's key, value and
// headers are kept; these say where it came from and when it is due.
const (
	HeaderRetryTopic     = "kpar.retry.original.topic"
	HeaderRetryPartition = "kpar.retry.original.partition"
	HeaderRetryOffset    = "kpar.retry.original.offset"
	HeaderRetryTimestamp = "kpar.retry.original.timestamp" // Unix milliseconds
	HeaderRetryLevel     = "kpar.retry.level"              // n of <topic>.retry.<n>
	HeaderRetryDue       = "kpar.retry.due"                // Unix milliseconds
	HeaderRetryAttempts  = "kpar.retry.attempts"           // attempts so far, over all levels
	HeaderRetryFirst     = "kpar.retry.first.failure"      // Unix milliseconds
	HeaderRetryClass     = "kpar.error.class"
	HeaderRetryMessage   = "__dlq.errors.message"
)

// RetryTopic names the n-th retry topic (from 1) of topic.
func RetryTopic(topic string, n int) string { return fmt.Sprintf("%s.retry.%d", topic, n) }

// retryLevelOf returns n when topic is one of our retry topics.
func (e *engine) retryLevelOf(topic string) int {
	if len(e.cfg.retryTopics) == 0 {
		return 0
	}
	i := strings.LastIndex(topic, ".retry.")
	if i < 0 {
		return 0
	}
	n, err := strconv.Atoi(topic[i+len(".retry."):])
	if err != nil || n < 1 || n > len(e.cfg.retryTopics) {
		return 0
	}
	for _, t := range e.cfg.topics {
		if t == topic[:i] {
			return n
		}
	}
	return 0
}

// consumedTopics is what the client subscribes to: the topics and, with
// RetryTopics, each topic's retry topics.
func (e *engine) consumedTopics() []string {
	ts := append([]string(nil), e.cfg.topics...)
	for _, t := range e.cfg.topics {
		for n := range e.cfg.retryTopics {
			ts = append(ts, RetryTopic(t, n+1))
		}
	}
	return ts
}

// createRetryTopics creates missing retry topics with their source's
// partition count. It is best effort: without the permission to create
// topics, an operator creates them and kpar only logs.
func (e *engine) createRetryTopics(ctx context.Context) {
	if len(e.cfg.retryTopics) == 0 {
		return
	}
	adm := kadm.NewClient(e.cl)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	details, err := adm.ListTopics(ctx, e.cfg.topics...)
	if err != nil {
		e.log.Warn("kpar: cannot list topics to create retry topics", "err", err)
		return
	}
	for _, t := range e.cfg.topics {
		d, ok := details[t]
		if !ok || d.Err != nil {
			continue
		}
		var missing []string
		for n := range e.cfg.retryTopics {
			missing = append(missing, RetryTopic(t, n+1))
		}
		resps, err := adm.CreateTopics(ctx, int32(len(d.Partitions)), -1, nil, missing...)
		if err != nil {
			e.log.Warn("kpar: cannot create retry topics", "topic", t, "err", err)
			continue
		}
		for _, r := range resps.Sorted() {
			if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
				e.log.Warn("kpar: cannot create retry topic", "topic", r.Topic, "err", r.Err)
			}
		}
	}
}

// decodeRetry reads the retry headers of a record consumed from retry topic
// level n into it: its due time, its history, and the original record the
// handler sees.
func decodeRetry(it *item, level int) {
	r := it.rec
	x := it.ext()
	x.level = level
	orig := *r
	orig.Headers = nil
	for _, h := range r.Headers {
		v := string(h.Value)
		switch h.Key {
		case HeaderRetryTopic:
			orig.Topic = v
		case HeaderRetryPartition:
			p, _ := strconv.ParseInt(v, 10, 32)
			orig.Partition = int32(p)
		case HeaderRetryOffset:
			orig.Offset, _ = strconv.ParseInt(v, 10, 64)
		case HeaderRetryTimestamp:
			ms, _ := strconv.ParseInt(v, 10, 64)
			orig.Timestamp = time.UnixMilli(ms)
		case HeaderRetryDue:
			ms, _ := strconv.ParseInt(v, 10, 64)
			x.due = time.UnixMilli(ms)
		case HeaderRetryAttempts:
			x.priorAttempts, _ = strconv.Atoi(v)
		case HeaderRetryFirst:
			ms, _ := strconv.ParseInt(v, 10, 64)
			x.firstFailure = time.UnixMilli(ms)
		case HeaderRetryLevel, HeaderRetryClass, HeaderRetryMessage:
		default:
			orig.Headers = append(orig.Headers, h)
		}
	}
	x.origin = &orig
}

// writeRetries produces records to their next retry topic and waits for the
// acknowledgements.
func (e *engine) writeRetries(ctx context.Context, ts []*task) error {
	if len(ts) == 0 {
		return nil
	}
	now := time.Now()
	recs := make([]*kgo.Record, len(ts))
	for i, t := range ts {
		it := &t.Value
		x := it.ext()
		orig := it.original()
		next := x.level + 1
		due := now.Add(e.cfg.retryTopics[next-1])
		msg := ""
		if x.lastErr != nil {
			msg = x.lastErr.Error()
		}
		hs := append([]kgo.RecordHeader(nil), orig.Headers...)
		hs = append(hs,
			kgo.RecordHeader{Key: HeaderRetryTopic, Value: []byte(orig.Topic)},
			kgo.RecordHeader{Key: HeaderRetryPartition, Value: strconv.AppendInt(nil, int64(orig.Partition), 10)},
			kgo.RecordHeader{Key: HeaderRetryOffset, Value: strconv.AppendInt(nil, orig.Offset, 10)},
			kgo.RecordHeader{Key: HeaderRetryTimestamp, Value: strconv.AppendInt(nil, orig.Timestamp.UnixMilli(), 10)},
			kgo.RecordHeader{Key: HeaderRetryLevel, Value: strconv.AppendInt(nil, int64(next), 10)},
			kgo.RecordHeader{Key: HeaderRetryDue, Value: strconv.AppendInt(nil, due.UnixMilli(), 10)},
			kgo.RecordHeader{Key: HeaderRetryAttempts, Value: strconv.AppendInt(nil, int64(it.totalAttempts()), 10)},
			kgo.RecordHeader{Key: HeaderRetryFirst, Value: strconv.AppendInt(nil, x.firstFailure.UnixMilli(), 10)},
			kgo.RecordHeader{Key: HeaderRetryClass, Value: []byte(x.class)},
			kgo.RecordHeader{Key: HeaderRetryMessage, Value: []byte(msg)},
		)
		recs[i] = &kgo.Record{
			Topic:     RetryTopic(orig.Topic, next),
			Key:       orig.Key,
			Value:     orig.Value,
			Headers:   hs,
			Timestamp: now,
		}
	}
	if err := e.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("producing to retry topics: %w", err)
	}
	for i, t := range ts {
		e.log.Info("kpar: record sent to retry topic", "topic", recs[i].Topic,
			"original_offset", t.Value.original().Offset, "due_in", e.cfg.retryTopics[t.Value.level()])
	}
	return nil
}
