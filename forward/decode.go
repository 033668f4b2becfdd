package forward

import (
	"context"
	"encoding/base64"
	"strconv"

	"github.com/kpar/kpar/internal/jsonstr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Typed records. With Decode, each record's value (and key) goes through a
// Decoder, typically a Schema Registry client (the module
// github.com/kpar/kpar/schema), before it is sent: the request's body is
// the decoded JSON, with Content-Type application/json, and these headers
// say what it was:
//
//	Kpar-Value-Form:     the form the value was in: avro, protobuf, jsonschema, raw
//	Kpar-Schema-Id:      the value's schema ID, decimal (absent when it had none)
//	Kpar-Key-Json:       the decoded key's JSON text, standard base64 (absent
//	                     when the key was not decoded; Kpar-Key keeps the
//	                     key's own bytes)
//	Kpar-Key-Form:       the form the key was in, when it was decoded
//	Kpar-Key-Schema-Id:  the key's schema ID, decimal
//
// A value the Decoder left raw (FormRaw: a record not in the wire format,
// with the Decoder's consent) is sent as without a Decoder. With Batch,
// each item's "value" is the decoded JSON itself rather than base64, its
// "value_form" says which form it holds ("raw": base64 as without a
// Decoder), and "value_schema_id", "key_json", "key_form" and
// "key_schema_id" mirror the headers. A decoding error is the record's
// outcome: kpar.Overloaded holds it (the registry is down), a
// kpar.Permanent error dead-letters it with its original bytes.

// Typed-record request headers.
const (
	HeaderValueForm   = "Kpar-Value-Form"
	HeaderSchemaID    = "Kpar-Schema-Id"
	HeaderKeyJSON     = "Kpar-Key-Json"
	HeaderKeyForm     = "Kpar-Key-Form"
	HeaderKeySchemaID = "Kpar-Key-Schema-Id"
)

// Decode sends each record decoded by d (see the package documentation's
// typed records); default none: the value's bytes as they are. A record
// whose context already carries its decoded form (WithDecoded) is not
// decoded again.
func Decode(d Decoder) Opt { return opt(func(c *cfg) { c.decoder = d }) }

// EncodeReplies turns each reply (Replies) into the bytes e makes of it,
// typically the Confluent wire format of a registered schema; default
// none: the answer's body as it is. A kpar.Permanent error from e
// dead-letters the input and produces nothing.
func EncodeReplies(e ReplyEncoder) Opt { return opt(func(c *cfg) { c.replyEncoder = e }) }

// decode returns r's decoded form: the one ctx carries, else the
// Decoder's; nil when there is neither (the value is sent as it is).
func (h *Handler) decode(ctx context.Context, r *kgo.Record) (*Decoded, error) {
	if d, ok := decodedFrom(ctx, r); ok {
		// A copy taken here: &d would move d to the heap on every call,
		// a record without a decoded form included.
		p := new(Decoded)
		*p = d
		return p, nil
	}
	if h.decoder == nil {
		return nil, nil
	}
	d, err := h.decoder.Decode(ctx, r)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// setDecodedHeaders sets the typed-record headers of d on hd.
func setDecodedHeaders(hd map[string][]string, d *Decoded) {
	if d.ValueForm != "" {
		hd[HeaderValueForm] = []string{string(d.ValueForm)}
	}
	if d.ValueForm != FormRaw && d.ValueForm != "" {
		hd["Content-Type"] = jsonType
	}
	if d.ValueSchemaID != 0 {
		hd[HeaderSchemaID] = []string{strconv.Itoa(d.ValueSchemaID)}
	}
	if d.Key != nil {
		hd[HeaderKeyJSON] = []string{base64.StdEncoding.EncodeToString(d.Key)}
		if d.KeyForm != "" {
			hd[HeaderKeyForm] = []string{string(d.KeyForm)}
		}
		if d.KeySchemaID != 0 {
			hd[HeaderKeySchemaID] = []string{strconv.Itoa(d.KeySchemaID)}
		}
	}
}

// appendDecodedItem appends the typed fields of a batch item after its
// "value" key: the value itself, then its form and schema IDs.
func appendDecodedItem(b []byte, r *kgo.Record, d *Decoded) []byte {
	if d.ValueForm == FormRaw || d.ValueForm == "" || d.Value == nil {
		b = appendBase64OrNull(b, r.Value)
	} else {
		b = append(b, d.Value...)
	}
	form := d.ValueForm
	if form == "" {
		form = FormRaw
	}
	b = append(b, `,"value_form":`...)
	b = jsonstr.Append(b, form)
	if d.ValueSchemaID != 0 {
		b = append(b, `,"value_schema_id":`...)
		b = strconv.AppendInt(b, int64(d.ValueSchemaID), 10)
	}
	if d.Key != nil {
		b = append(b, `,"key_json":`...)
		b = append(b, d.Key...)
		b = append(b, `,"key_form":`...)
		b = jsonstr.Append(b, d.KeyForm)
		if d.KeySchemaID != 0 {
			b = append(b, `,"key_schema_id":`...)
			b = strconv.AppendInt(b, int64(d.KeySchemaID), 10)
		}
	}
	return b
}
