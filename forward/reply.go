package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// Replies. With Replies(topic), the body of a 2xx answer becomes a record
// on topic, the reply, which kpar produces with the input's completion
// (kpar.Emit: at least once with kpar.Outputs, exactly once with
// kpar.ExactlyOnce): the endpoint's answer, turned into an event, as
// Knative's KafkaSource does.
//
// A reply is keyed like its input, and carries these headers:
//
//	content-type:          the answer's Content-Type (absent when it had none)
//	kpar.reply.topic:      the input's topic
//	kpar.reply.partition:  the input's partition, decimal
//	kpar.reply.offset:     the input's offset, decimal
//	traceparent, tracestate: the input's trace context, when it has one
//
// A 204 answer, or a 2xx with an empty body, makes no reply. With Batch,
// an item of the batch answer makes a reply with its "reply" field: any
// JSON value, whose JSON text becomes the reply's value (content-type
// application/json); a status code alone, or "reply": null, makes none.

// Reply headers.
const (
	HeaderReplyTopic     = "kpar.reply.topic"
	HeaderReplyPartition = "kpar.reply.partition"
	HeaderReplyOffset    = "kpar.reply.offset"
)

// maxReply bounds the body a reply takes: the default largest record
// (message.max.bytes, 1 MB) of a Kafka broker.
const maxReply = 1 << 20

// Replies makes the body of each 2xx answer a record on topic (see the
// package doc's Replies), produced through kpar.Emit: the Consumer (or
// Backfill) needs kpar.Outputs or kpar.ExactlyOnce. Default: none.
func Replies(topic string) Opt { return opt(func(c *cfg) { c.replyTopic = topic }) }

// reply builds the reply record of in with value and contentType.
func (h *Handler) reply(in *kgo.Record, value []byte, contentType string) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, 6)
	if contentType != "" {
		hs = append(hs, kgo.RecordHeader{Key: "content-type", Value: []byte(contentType)})
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderReplyTopic, Value: []byte(in.Topic)},
		kgo.RecordHeader{Key: HeaderReplyPartition, Value: strconv.AppendInt(nil, int64(in.Partition), 10)},
		kgo.RecordHeader{Key: HeaderReplyOffset, Value: strconv.AppendInt(nil, in.Offset, 10)},
	)
	for _, rh := range in.Headers {
		if rh.Key == TraceParent || rh.Key == TraceState {
			hs = append(hs, rh)
		}
	}
	return &kgo.Record{Topic: h.replyTopic, Key: in.Key, Value: value, Headers: hs}
}

// emitReply emits the reply of in from a 2xx answer, and closes its body.
func (h *Handler) emitReply(ctx context.Context, in *kgo.Record, resp *http.Response) error {
	defer drain(resp)
	if resp.StatusCode == http.StatusNoContent || resp.ContentLength == 0 {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		// The answer was a success: reading it again means asking again.
		return kpar.Overloaded(fmt.Errorf("forward: reading the reply of %s/%d/%d: %w", in.Topic, in.Partition, in.Offset, err))
	}
	if len(body) == 0 {
		return nil
	}
	if len(body) > maxReply {
		return kpar.Permanent(fmt.Errorf("forward: the reply to %s/%d/%d is larger than %d bytes, the largest record a broker takes by default", in.Topic, in.Partition, in.Offset, maxReply))
	}
	return h.emitValue(ctx, in, body, resp.Header.Get("Content-Type"))
}

// emitValue emits the reply of in with value, through the ReplyEncoder
// when there is one: its bytes replace the value, and the reply has no
// content-type (the wire format says what it holds).
func (h *Handler) emitValue(ctx context.Context, in *kgo.Record, value []byte, contentType string) error {
	if h.replyEncoder != nil {
		enc, err := h.replyEncoder.EncodeReply(ctx, in, value)
		if err != nil {
			return err
		}
		value, contentType = enc, ""
	}
	return h.emit(ctx, h.reply(in, value, contentType))
}

// emit hands a reply to kpar, saying what is missing when it cannot.
func (h *Handler) emit(ctx context.Context, r *kgo.Record) error {
	err := kpar.Emit(ctx, r)
	if errors.Is(err, kpar.ErrNoOutputs) {
		return kpar.Permanent(fmt.Errorf("forward: Replies needs kpar.Outputs or kpar.ExactlyOnce on the consumer: %w", err))
	}
	return err
}
