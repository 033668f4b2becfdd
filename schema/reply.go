package schema

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/forward"
)

// ReplyEncoder encodes an endpoint's JSON replies with a subject's schema
// in the Confluent wire format. It implements forward.ReplyEncoder.
type ReplyEncoder struct {
	reg     *Registry
	subject string
	version int // -1: the latest
}

var _ forward.ReplyEncoder = (*ReplyEncoder)(nil)

// ParseSubject reads SUBJECT or SUBJECT:VERSION (version -1: the
// latest).
func ParseSubject(s string) (subject string, version int, err error) {
	subject, v, ok := strings.Cut(s, ":")
	if strings.TrimSpace(subject) == "" {
		return "", 0, fmt.Errorf("%q names no subject", s)
	}
	if !ok || v == "latest" {
		return subject, -1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return "", 0, fmt.Errorf("%q: version %q is not a number from 1", s, v)
	}
	return subject, n, nil
}

// NewReplyEncoder returns an encoder with subject's schema at version
// (-1: the latest, looked up once). It asks the registry now, so that a
// wrong subject fails at start.
func NewReplyEncoder(ctx context.Context, reg *Registry, subject string, version int) (*ReplyEncoder, error) {
	if _, err := reg.bySubject(ctx, subject, version); err != nil {
		return nil, err
	}
	return &ReplyEncoder{reg: reg, subject: subject, version: version}, nil
}

// EncodeReply implements forward.ReplyEncoder: a reply that does not fit
// the schema is a kpar.Permanent error, which dead-letters its input.
func (e *ReplyEncoder) EncodeReply(ctx context.Context, in *kgo.Record, value []byte) ([]byte, error) {
	c, err := e.reg.bySubject(ctx, e.subject, e.version)
	if err != nil {
		return nil, err
	}
	out := appendPrefix(make([]byte, 0, 16+len(value)), c.id)
	switch c.form {
	case forward.FormAvro:
		enc, err := jsonToAvro(c.avro, value)
		if err != nil {
			return nil, e.misfit(c, err)
		}
		return append(out, enc...), nil
	case forward.FormProtobuf:
		md, err := c.message([]int{0})
		if err != nil {
			return nil, e.misfit(c, err)
		}
		m := dynamicpb.NewMessage(md)
		if err := protojson.Unmarshal(value, m); err != nil {
			return nil, e.misfit(c, err)
		}
		out = appendIndexes(out, []int{0})
		return proto.MarshalOptions{}.MarshalAppend(out, m)
	default:
		if err := c.validateJSON(value); err != nil {
			return nil, e.misfit(c, err)
		}
		return append(out, value...), nil
	}
}

func (e *ReplyEncoder) misfit(c *compiled, err error) error {
	return kpar.Permanent(fmt.Errorf("the reply does not fit schema ID %d (subject %s, %s): %w", c.id, e.subject, c.form, err))
}

// LazyReplyEncoder is NewReplyEncoder without the lookup at start: for a
// registry that does not answer yet (the first reply waits for it).
func LazyReplyEncoder(reg *Registry, subject string, version int) *ReplyEncoder {
	return &ReplyEncoder{reg: reg, subject: subject, version: version}
}
