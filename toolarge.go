package kpar

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// Outputs too large for their topic. A handler's output (kpar forward's
// reply), a retry-topic record or a dead letter can be under kpar's own
// limits and still over its topic's max.message.bytes. The broker then
// refuses it with MESSAGE_TOO_LARGE, every time: producing it again cannot
// help, and waiting for it would hold its input's partition (at least
// once) or every commit (exactly once: each transaction aborts) for ever.
// It is the record's own fault, not the downstream's overload:
//
//   - at least once, the attempt fails Permanent, saying which topic
//     refused which output, and the input goes to the dead letters (the
//     sink's own cut-to-fit applies to the letter);
//   - exactly once, the transaction is aborted; the input whose output
//     was refused has its outputs replaced by its dead letter, a dead
//     letter refused is cut further (as deadletter.KafkaSink does), and
//     the rest go in the next transaction, untouched.
//
// The broker checks a whole record batch, and the producer puts several
// records in one: a record can be refused for its neighbours. An output is
// blamed only when it alone is larger than the topic's max.message.bytes
// (read once per topic); otherwise it is produced again, and the log says
// to lower the producer's batch size for that topic.

// defaultBatchMax is franz-go's default ProducerBatchMaxBytes: the client
// refuses a larger record itself.
const defaultBatchMax = 1_000_012

// oneRecordBatch bounds what a record batch of one record adds to its
// key, value and headers: the batch header (61 bytes) and the record's
// varints and attributes.
const oneRecordBatch = 61 + 40

// isTooLarge reports whether err is a refusal of a record for its size,
// by the broker or by the client.
func isTooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// recordBytes estimates the size of a batch holding r alone, uncompressed.
func recordBytes(r *kgo.Record) int {
	n := oneRecordBatch + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}

// topicLimits caches each topic's max.message.bytes.
type topicLimits struct {
	mu     sync.Mutex // guards max; never held across the request
	max    map[string]int
	warned sync.Map // topic -> true once warnBatchTooLarge spoke of it
}

// limit returns topic's max.message.bytes, read with cl once; 0 when it
// cannot be read.
func (l *topicLimits) limit(ctx context.Context, cl *kgo.Client, topic string) int {
	l.mu.Lock()
	n, ok := l.max[topic]
	l.mu.Unlock()
	if ok {
		return n
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0
	}
	rc, err := rcs.On(topic, nil)
	if err != nil || rc.Err != nil {
		return 0
	}
	for _, c := range rc.Configs {
		if c.Key == "max.message.bytes" && c.Value != nil {
			n, _ = strconv.Atoi(*c.Value)
		}
	}
	if n > 0 {
		l.mu.Lock()
		if l.max == nil {
			l.max = make(map[string]int)
		}
		l.max[topic] = n
		l.mu.Unlock()
	}
	return n
}

// guilty reports whether r, refused as too large, is too large alone: for
// its topic (as far as its limit can be read) or for the client's batch.
// A record refused only for the batch it was in is not.
func (o *outputs) guilty(ctx context.Context, r *kgo.Record) bool {
	size := recordBytes(r)
	if size > defaultBatchMax {
		return true
	}
	limit := o.limits.limit(ctx, o.cl, r.Topic)
	return limit == 0 || size > limit
}

// outputFailed turns the failed produce of output r (at least once) into
// the attempt's error: Permanent when r alone is too large for its topic,
// so that its input goes to the dead letters with the reason, else
// Overloaded, as any other failed produce.
func (e *engine) outputFailed(ctx context.Context, r *kgo.Record, err error) error {
	if isTooLarge(err) {
		if e.out.guilty(ctx, r) {
			return Permanent(fmt.Errorf("kpar: its output to topic %s (%d bytes) was refused as too large for that topic (%w); no retry can make it fit: raise %[1]s's max.message.bytes (and the producer's ProducerBatchMaxBytes) or emit less", r.Topic, recordBytes(r), err))
		}
		e.warnBatchTooLarge(r.Topic, err)
	}
	return Overloaded(fmt.Errorf("kpar: producing the record's outputs failed: %w", err))
}

// warnBatchTooLarge says, once per topic, that a batch of records that
// each fit was refused as too large for topic.
func (e *engine) warnBatchTooLarge(topic string, err error) {
	if _, warned := e.out.limits.warned.LoadOrStore(topic, true); warned {
		return
	}
	e.log.Warn("kpar: outputs refused as too large only for the batch they were in (each fits the topic alone: a larger neighbour or the whole batch did not); they are produced again. If this repeats with no record dead-lettered as too large, lower the producer's batch size for this topic to its max.message.bytes (kgo.ProducerBatchMaxBytesFn in ClientOptions)",
		"topic", topic, "err", err)
}

// refit replaces the outputs of o, one of which (r) its topic refused as
// too large alone (refusal), in a transaction that was aborted: handler outputs
// and a retry-topic record give way to the input's dead letter, saying
// why; a dead letter is cut further (see deadletter.KafkaSink). Without a
// dead-letter sink, or once a dead letter cannot be cut any more, o stays
// as it is and the log says what to do: the transactions keep failing
// until an operator does it (nothing is lost, nothing commits). It
// reports whether o changed.
func (e *engine) refit(ctx context.Context, o *pendingOutput, r *kgo.Record, refusal error) bool {
	sink, _ := e.cfg.deadLetters.(*deadletter.KafkaSink)
	what := [...]string{outHandler: "output", outRetry: "retry-topic record", outDeadLetter: "dead letter"}[o.kind]
	if sink == nil {
		e.log.Error("kpar: a finished record's "+what+" is too large for its topic and there is no dead-letter sink to put the record in instead; transactions abort and commits wait until the topic's max.message.bytes is raised (or set DeadLetters)",
			"topic", r.Topic, "bytes", recordBytes(r), "record", outputInputID(o.in), "err", refusal)
		return false
	}
	if o.kind == outDeadLetter {
		rec, stage, err := sink.Cut(ctx, *o.letter, o.cut+1)
		if err != nil {
			e.log.Error("kpar: a dead letter is too large for its topic even cut to the bone; transactions abort and commits wait until the topic's max.message.bytes is raised",
				"topic", r.Topic, "record", outputInputID(o.in), "err", err)
			return false
		}
		o.recs, o.cut = []*kgo.Record{rec}, stage
		return true
	}
	now := time.Now()
	var l deadletter.Letter
	reason := fmt.Sprintf("its %s to topic %s (%d bytes) was refused as too large for that topic (%v); no retry can make it fit: raise %[2]s's max.message.bytes to keep such records", what, r.Topic, recordBytes(r), refusal)
	if o.letter != nil {
		l = *o.letter
		if l.Message != "" {
			l.Message += "; "
		}
		l.Message += reason
	} else {
		l = deadletter.Letter{
			Record: o.in, Group: e.cfg.letterGroup(), Class: deadletter.ClassPermanent,
			Message: "kpar: " + reason, Attempts: o.attempts, FirstFailure: now, LastFailure: now,
		}
	}
	recs, err := sink.Records(ctx, []deadletter.Letter{l})
	if err != nil {
		e.log.Error("kpar: making the dead letter of a record whose output is too large failed; the next transaction tries again", "record", outputInputID(o.in), "err", err)
		return false
	}
	e.log.Warn("kpar: record dead-lettered in place of its outputs", "topic", o.in.Topic, "partition", o.in.Partition,
		"offset", o.in.Offset, "class", l.Class, "attempts", l.Attempts, "err", l.Message)
	for _, h := range e.hooks.deadLettered {
		h.OnDeadLettered(l)
	}
	o.recs, o.kind, o.letter, o.cut = recs, outDeadLetter, &l, 0
	return true
}

// outputInputID names r as topic/partition@offset.
func outputInputID(r *kgo.Record) string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset)
}
