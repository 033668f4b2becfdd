package schema

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/forward"
)

// Undecodable says what becomes of a value that is not in the Confluent
// wire format.
type Undecodable int

const (
	// DeadLetter sends it to the dead letters (the default).
	DeadLetter Undecodable = iota
	// Raw sends it as it is, as without a Decoder.
	Raw
)

// Decoder decodes records in the Confluent wire format to JSON through a
// Registry. It implements forward.Decoder.
type Decoder struct {
	reg         *Registry
	undecodable Undecodable
}

var _ forward.Decoder = (*Decoder)(nil)

// NewDecoder returns a Decoder over reg; u says what to do with a value
// not in the wire format.
func NewDecoder(reg *Registry, u Undecodable) *Decoder {
	return &Decoder{reg: reg, undecodable: u}
}

// Decode implements forward.Decoder. A nil value (a tombstone) stays raw.
// A key is decoded when it is in the wire format (or has a
// __key_schema_id header) and is left as it is otherwise: string keys
// beside Avro values are common.
func (d *Decoder) Decode(ctx context.Context, r *kgo.Record) (forward.Decoded, error) {
	var out forward.Decoded
	if r.Value == nil {
		out.Value, out.ValueForm = nil, forward.FormRaw
	} else {
		v, form, id, err := d.decode(ctx, r.Value, header(r, HeaderValueSchemaID))
		switch {
		case err == errRaw && d.undecodable == Raw:
			out.Value, out.ValueForm = r.Value, forward.FormRaw
		case err == errRaw:
			_, _, perr := parsePrefix(r.Value)
			return out, kpar.Permanent(fmt.Errorf("deserialization error: the value is %v (--undecodable raw sends such values as they are)", perr))
		case err != nil:
			return out, err
		default:
			out.Value, out.ValueForm, out.ValueSchemaID = v, form, id
		}
	}
	if r.Key != nil {
		k, form, id, err := d.decode(ctx, r.Key, header(r, HeaderKeySchemaID))
		switch {
		case err == errRaw:
		case err != nil:
			return out, fmt.Errorf("key: %w", err)
		default:
			out.Key, out.KeyForm, out.KeySchemaID = k, form, id
		}
	}
	return out, nil
}

// errRaw says that bytes are not in the wire format.
var errRaw = fmt.Errorf("not in the wire format")

func header(r *kgo.Record, name string) []byte {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == name {
			return r.Headers[i].Value
		}
	}
	return nil
}

// decode decodes b, whose schema identity is its prefix or, when hdr is
// not nil, hdr.
func (d *Decoder) decode(ctx context.Context, b, hdr []byte) ([]byte, forward.Form, int, error) {
	pre := b
	if hdr != nil {
		pre = hdr
	} else if !(len(b) >= 5 && b[0] == magicID || len(b) >= 17 && b[0] == magicGUID) {
		return nil, "", 0, errRaw // common for keys: no error text built per record
	}
	rf, rest, err := parsePrefix(pre)
	if err != nil {
		if hdr != nil {
			return nil, "", 0, kpar.Permanent(fmt.Errorf("deserialization error: schema ID header: %w", err))
		}
		return nil, "", 0, errRaw
	}
	payload := rest
	if hdr != nil {
		payload = b
	}
	c, err := d.reg.byRef(ctx, rf)
	if err != nil {
		return nil, "", 0, err
	}
	var idx []int
	if c.form == forward.FormProtobuf {
		if hdr != nil && len(rest) > 0 {
			idx, _, err = parseIndexes(rest)
		} else {
			idx, payload, err = parseIndexes(payload)
		}
		if err != nil {
			return nil, "", 0, kpar.Permanent(fmt.Errorf("deserialization error: protobuf schema %s: %w", rf, err))
		}
	}
	v, err := c.decode(payload, idx, d.reg.validate)
	if err != nil {
		return nil, "", 0, kpar.Permanent(fmt.Errorf("deserialization error: %s schema %s: %w", c.form, rf, err))
	}
	return v, c.form, c.id, nil
}
