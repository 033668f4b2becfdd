package route

import (
	"context"
	"strings"
	"unicode/utf8"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/interpreter"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/forward"
)

// activation gives an expression the variables of one record. key, value
// and headers are built on first use and kept for the other expressions of
// the same record; the record is decoded at most once. Activations are
// pooled by their Handler: one serves one Handle call.
type activation struct {
	h   *Handler
	ctx context.Context
	r   *kgo.Record

	decodeTried bool
	decoded     bool // d holds r decoded
	d           forward.Decoded
	decodeErr   error // the Decoder's error: the record's, not the expression's

	value, key, headers any // nil: not built yet

	// What choose found, counted once the record's outcome is final.
	passed bool      // the filter was true
	chosen *program  // the rule that matched; nil: the fallback, or none
	fails  []failure // the evaluations that failed
}

var _ interpreter.Activation = (*activation)(nil)

// reset empties a for the pool, keeping the room of its fails.
func (a *activation) reset() {
	clear(a.fails)
	*a = activation{h: a.h, fails: a.fails[:0]}
}

// Parent is nil: the record's variables are all there is.
func (a *activation) Parent() interpreter.Activation { return nil }

// ResolveName returns the value of the variable name.
func (a *activation) ResolveName(name string) (any, bool) {
	switch name {
	case varTopic:
		return types.String(a.r.Topic), true
	case varPartition:
		return types.Int(a.r.Partition), true
	case varOffset:
		return types.Int(a.r.Offset), true
	case varTimestamp:
		return types.Timestamp{Time: a.r.Timestamp}, true
	case varHeaders:
		if a.headers == nil {
			a.headers = headerMap(a.r.Headers)
		}
		return a.headers, true
	case varValue:
		if a.value == nil {
			a.value = orNull(a.valueOf())
		}
		return a.value, true
	case varKey:
		if a.key == nil {
			a.key = orNull(a.keyOf())
		}
		return a.key, true
	}
	return nil, false
}

// orNull is v, or CEL's null for JSON's (nil), which would read as "not
// built yet".
func orNull(v any) any {
	if v == nil {
		return types.NullValue
	}
	return v
}

// decode runs the Decoder once; false when there is none or it failed.
func (a *activation) decode() bool {
	if a.h.decoder == nil {
		return false
	}
	if !a.decodeTried {
		a.decodeTried = true
		a.d, a.decodeErr = a.h.decoder.Decode(a.ctx, a.r)
		a.decoded = a.decodeErr == nil
	}
	return a.decoded
}

// errDecode is what an expression sees when the Decoder failed; the
// record's Handle returns the Decoder's error itself.
var errDecode = types.NewErr("the record could not be decoded")

func (a *activation) valueOf() any {
	if a.r.Value == nil {
		return types.NullValue
	}
	raw := a.r.Value
	if a.h.decoder != nil {
		if !a.decode() {
			return errDecode
		}
		if a.d.ValueForm != forward.FormRaw {
			return parseJSON(a.d.Value, "value")
		}
		raw = a.d.Value
	}
	if a.h.jsonDefault && !hasContentType(a.r) || isJSON(contentType(a.r)) {
		return parseJSON(raw, "value")
	}
	return types.Bytes(raw)
}

func (a *activation) keyOf() any {
	if a.r.Key == nil {
		return types.NullValue
	}
	if a.h.decoder != nil {
		if !a.decode() {
			return errDecode
		}
		if a.d.Key != nil && a.d.KeyForm != forward.FormRaw {
			return parseJSON(a.d.Key, "key")
		}
	}
	if utf8.Valid(a.r.Key) {
		return types.String(a.r.Key)
	}
	return types.Bytes(a.r.Key)
}

// headerMap is the record's headers by name; the last of a repeated name
// wins, as it does for content-type.
func headerMap(hs []kgo.RecordHeader) map[string]string {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	return m
}

// contentType is the value of r's last content-type header (any case), ""
// when it has none: forward's rule for the request's Content-Type.
func contentType(r *kgo.Record) string {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if k := r.Headers[i].Key; len(k) == len(forward.ContentTypeHeader) && strings.EqualFold(k, forward.ContentTypeHeader) {
			return string(r.Headers[i].Value)
		}
	}
	return ""
}

func hasContentType(r *kgo.Record) bool { return strings.TrimSpace(contentType(r)) != "" }

// isJSON reports whether a media type says JSON: application/json, or a
// structured syntax suffix +json (application/cloudevents+json), with any
// parameters.
func isJSON(mediaType string) bool {
	t, _, _ := strings.Cut(mediaType, ";")
	t = strings.ToLower(strings.TrimSpace(t))
	return t == "application/json" || strings.HasSuffix(t, "+json") && strings.Contains(t, "/")
}
