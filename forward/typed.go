package forward

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Form names what a request's value (or key) holds after decoding.
type Form string

// The forms a Decoder reports. FormRaw is the record's bytes as they are.
const (
	FormRaw        Form = "raw"
	FormAvro       Form = "avro"
	FormProtobuf   Form = "protobuf"
	FormJSONSchema Form = "jsonschema"
)

// Decoded is a record's value and key as a Decoder turned them into what
// the request carries.
type Decoded struct {
	Value         []byte // the request body: JSON, or the raw value when ValueForm is FormRaw
	ValueForm     Form
	ValueSchemaID int    // the value's schema ID; 0 when it carried none
	Key           []byte // the key as JSON; nil when the key was not decoded
	KeyForm       Form
	KeySchemaID   int
}

// A Decoder turns a record's value and key into JSON, typically through a
// schema registry. An error that kpar.Overloaded wraps (the registry cannot
// be reached) holds the record and burns no attempt; a kpar.Permanent error
// (a schema the registry does not know, bytes that do not decode) sends the
// record, with its original bytes, to the dead letters.
type Decoder interface {
	Decode(ctx context.Context, r *kgo.Record) (Decoded, error)
}

// A ReplyEncoder turns an endpoint's JSON reply into the bytes the reply
// record carries (typically the Confluent wire format of a registered
// schema). A kpar.Permanent error dead-letters the input and produces
// nothing.
type ReplyEncoder interface {
	EncodeReply(ctx context.Context, in *kgo.Record, value []byte) ([]byte, error)
}

type decodedKey struct{ r *kgo.Record }

// WithDecoded returns a context that carries d as r's decoded form, so that
// a Handler given it does not decode r again (a router that decoded r to
// evaluate its rules hands the result on this way).
func WithDecoded(ctx context.Context, r *kgo.Record, d Decoded) context.Context {
	return context.WithValue(ctx, decodedKey{r}, d)
}

// decodedFrom returns r's decoded form carried by ctx, if any.
func decodedFrom(ctx context.Context, r *kgo.Record) (Decoded, bool) {
	d, ok := ctx.Value(decodedKey{r}).(Decoded)
	return d, ok
}

// DecodedFrom returns r's decoded form carried by ctx (WithDecoded), if
// any: for a Handler other than this package's that a router hands
// decoded records to, and for tests of such routers.
func DecodedFrom(ctx context.Context, r *kgo.Record) (Decoded, bool) {
	return decodedFrom(ctx, r)
}
