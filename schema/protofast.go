package schema

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/kpar/kpar/internal/jsonstr"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A fast path from Protobuf's wire format to the JSON protojson writes by
// default, without building a dynamic message: the decoder walks the
// bytes with the message's descriptor. It takes messages made of scalars,
// strings, bytes, enums, nested messages, repeated fields and maps, whose
// singular message fields each occur once; anything else (well-known
// types, groups, a message split across occurrences) returns errSlowPath
// and goes through dynamicpb and protojson, the reference.

var errSlowPath = errors.New("protobuf fast path: not taken")

// fastOK caches whether a message descriptor (and every message it
// holds) suits the fast path.
var fastOK sync.Map // protoreflect.MessageDescriptor -> bool

func fastPath(md protoreflect.MessageDescriptor) bool {
	if v, ok := fastOK.Load(md); ok {
		return v.(bool)
	}
	ok := fastPathCheck(md, map[protoreflect.FullName]bool{})
	fastOK.Store(md, ok)
	return ok
}

func fastPathCheck(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return true
	}
	seen[md.FullName()] = true
	if md.ParentFile() != nil && md.ParentFile().Package() == "google.protobuf" {
		return false // well-known types have JSON forms of their own
	}
	if md.ExtensionRanges().Len() > 0 || md.Syntax() != protoreflect.Proto3 {
		return false // proto2's closed enums and defaults: the reference path
	}
	fs := md.Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		if fd.Kind() == protoreflect.GroupKind {
			return false
		}
		if fd.IsMap() {
			if fd.MapValue().Kind() == protoreflect.MessageKind && !fastPathCheck(fd.MapValue().Message(), seen) {
				return false
			}
			continue
		}
		if fd.Kind() == protoreflect.MessageKind && !fastPathCheck(fd.Message(), seen) {
			return false
		}
	}
	return true
}

// span is one occurrence of a field in a message's bytes.
type span struct {
	field int // index in the descriptor's fields
	typ   protowire.Type
	v     []byte // the value's bytes (for varints and fixed, the raw encoding)
}

type protoWalker struct {
	out    []byte
	budget int
	depth  int
}

func protoToJSON(md protoreflect.MessageDescriptor, b []byte) ([]byte, error) {
	w := protoWalker{out: make([]byte, 0, 2*len(b)+16), budget: 16*len(b) + 1024}
	if err := w.message(md, b); err != nil {
		return nil, err
	}
	return w.out, nil
}

func (w *protoWalker) message(md protoreflect.MessageDescriptor, b []byte) error {
	if w.depth++; w.depth > maxDepth {
		return errSlowPath
	}
	defer func() { w.depth-- }()
	fields := md.Fields()
	var arr [16]span
	spans := arr[:0]
	for len(b) > 0 {
		if w.budget--; w.budget < 0 {
			return errSlowPath
		}
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num < protowire.MinValidNumber || num > protowire.MaxValidNumber {
			return fmt.Errorf("field number %d out of range", num)
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return protowire.ParseError(m)
		}
		v := b[:m]
		b = b[m:]
		fd := fields.ByNumber(num)
		if fd == nil || !fitsWire(fd, typ) {
			continue // unknown (a wrong wire type is too): protojson leaves it out
		}
		spans = append(spans, span{field: fd.Index(), typ: typ, v: v})
	}
	// Declaration order, as protojson writes; insertion sort keeps the
	// wire order within a field.
	for i := 1; i < len(spans); i++ {
		for j := i; j > 0 && spans[j-1].field > spans[j].field; j-- {
			spans[j-1], spans[j] = spans[j], spans[j-1]
		}
	}
	w.out = append(w.out, '{')
	first := true
	for i := 0; i < len(spans); {
		j := i + 1
		for j < len(spans) && spans[j].field == spans[i].field {
			j++
		}
		fd := fields.Get(spans[i].field)
		mark := len(w.out)
		if !first {
			w.out = append(w.out, ',')
		}
		w.out = append(w.out, '"')
		w.out = append(w.out, fd.JSONName()...)
		w.out = append(w.out, '"', ':')
		wrote, err := w.field(fd, spans[i:j])
		if err != nil {
			return err
		}
		if wrote {
			first = false
		} else {
			w.out = w.out[:mark]
		}
		i = j
	}
	w.out = append(w.out, '}')
	return nil
}

// field writes the value of fd from its occurrences; wrote is false for a
// value protojson leaves out (a default without presence, an empty list).
func (w *protoWalker) field(fd protoreflect.FieldDescriptor, occ []span) (wrote bool, err error) {
	switch {
	case fd.IsMap():
		if len(occ) > 64 || duplicateKeys(occ) {
			return false, errSlowPath // the last of a key wins: the reference path
		}
		w.out = append(w.out, '{')
		for i, s := range occ {
			if s.typ != protowire.BytesType {
				return false, errSlowPath
			}
			entry, _ := protowire.ConsumeBytes(s.v)
			if i > 0 {
				w.out = append(w.out, ',')
			}
			if err := w.mapEntry(fd, entry); err != nil {
				return false, err
			}
		}
		w.out = append(w.out, '}')
		return true, nil
	case fd.IsList():
		w.out = append(w.out, '[')
		n := 0
		for _, s := range occ {
			if s.typ == protowire.BytesType && fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.BytesKind && fd.Kind() != protoreflect.MessageKind {
				packed, _ := protowire.ConsumeBytes(s.v)
				for len(packed) > 0 {
					if n > 0 {
						w.out = append(w.out, ',')
					}
					m, err := w.scalar(fd, wireTypeOf(fd.Kind()), packed, true)
					if err != nil {
						return false, err
					}
					packed = packed[m:]
					n++
				}
				continue
			}
			if n > 0 {
				w.out = append(w.out, ',')
			}
			if _, err := w.scalar(fd, s.typ, s.v, true); err != nil {
				return false, err
			}
			n++
		}
		w.out = append(w.out, ']')
		return n > 0, nil
	}
	if fd.Kind() == protoreflect.MessageKind && len(occ) > 1 {
		return false, errSlowPath // protobuf merges the occurrences
	}
	last := occ[len(occ)-1]
	mark := len(w.out)
	if _, err := w.scalar(fd, last.typ, last.v, true); err != nil {
		return false, err
	}
	if !fd.HasPresence() && string(w.out[mark:]) == defaultValue(fd) {
		w.out = w.out[:mark]
		return false, nil
	}
	return true, nil
}

// fitsWire reports whether a field of fd's kind may come with wire type
// typ (packed repeated scalars come as bytes).
func fitsWire(fd protoreflect.FieldDescriptor, typ protowire.Type) bool {
	k := fd.Kind()
	switch k {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return typ == protowire.BytesType
	}
	return typ == wireTypeOf(k) || fd.IsList() && typ == protowire.BytesType
}

// duplicateKeys reports whether map entries repeat a key's bytes.
func duplicateKeys(occ []span) bool {
	if len(occ) < 2 {
		return false
	}
	keys := make([][]byte, len(occ))
	for i, s := range occ {
		entry, _ := protowire.ConsumeBytes(s.v)
		for len(entry) > 0 {
			num, typ, n := protowire.ConsumeTag(entry)
			if n < 0 {
				return true
			}
			m := protowire.ConsumeFieldValue(num, typ, entry[n:])
			if m < 0 {
				return true
			}
			if num == 1 {
				keys[i] = entry[n : n+m]
			}
			entry = entry[n+m:]
		}
		for j := range i {
			if string(keys[j]) == string(keys[i]) {
				return true
			}
		}
	}
	return false
}

func (w *protoWalker) mapEntry(fd protoreflect.FieldDescriptor, b []byte) error {
	kd, vd := fd.MapKey(), fd.MapValue()
	var key, val *span
	var ks, vs span
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num < protowire.MinValidNumber || num > protowire.MaxValidNumber {
			return fmt.Errorf("map entry: field number %d out of range", num)
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return protowire.ParseError(m)
		}
		switch {
		case num == 1 && fitsWire(kd, typ):
			ks, key = span{typ: typ, v: b[:m]}, &ks
		case num == 2 && fitsWire(vd, typ):
			if val != nil && vd.Kind() == protoreflect.MessageKind {
				return errSlowPath // protobuf merges the occurrences
			}
			vs, val = span{typ: typ, v: b[:m]}, &vs
		}
		b = b[m:]
	}
	if key == nil {
		w.out = append(w.out, defaultKey(kd)...)
	} else {
		mark := len(w.out)
		if _, err := w.scalar(kd, key.typ, key.v, false); err != nil {
			return err
		}
		if w.out[mark] != '"' {
			w.out = append(w.out[:mark], append([]byte{'"'}, append(w.out[mark:], '"')...)...)
		}
	}
	w.out = append(w.out, ':')
	if val == nil {
		if vd.Kind() == protoreflect.MessageKind {
			w.out = append(w.out, '{', '}')
			return nil
		}
		w.out = append(w.out, defaultValue(vd)...)
		return nil
	}
	_, err := w.scalar(vd, val.typ, val.v, true)
	return err
}

func defaultKey(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return `""`
	case protoreflect.BoolKind:
		return `"false"`
	}
	return `"0"`
}

func defaultValue(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind:
		return `""`
	case protoreflect.BoolKind:
		return `false`
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return `"0"`
	case protoreflect.EnumKind:
		if v := fd.Enum().Values().ByNumber(0); v != nil {
			return `"` + string(v.Name()) + `"`
		}
	}
	return `0`
}

func wireTypeOf(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	}
	return protowire.VarintType
}

// scalar writes one value of fd's kind from b (wire type typ) and returns
// the bytes it took.
func (w *protoWalker) scalar(fd protoreflect.FieldDescriptor, typ protowire.Type, b []byte, _ bool) (int, error) {
	k := fd.Kind()
	if typ != wireTypeOf(k) && !(typ == protowire.BytesType && (k == protoreflect.StringKind || k == protoreflect.BytesKind || k == protoreflect.MessageKind)) {
		return 0, fmt.Errorf("field %s: wire type %d does not fit %s", fd.Name(), typ, k)
	}
	switch typ {
	case protowire.VarintType:
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		switch k {
		case protoreflect.BoolKind:
			w.out = strconv.AppendBool(w.out, v != 0)
		case protoreflect.Int32Kind:
			w.out = strconv.AppendInt(w.out, int64(int32(v)), 10)
		case protoreflect.Sint32Kind:
			w.out = strconv.AppendInt(w.out, int64(int32(protowire.DecodeZigZag(v&math.MaxUint32))), 10)
		case protoreflect.Uint32Kind:
			w.out = strconv.AppendUint(w.out, uint64(uint32(v)), 10)
		case protoreflect.Int64Kind:
			w.out = append(strconv.AppendInt(append(w.out, '"'), int64(v), 10), '"')
		case protoreflect.Sint64Kind:
			w.out = append(strconv.AppendInt(append(w.out, '"'), protowire.DecodeZigZag(v), 10), '"')
		case protoreflect.Uint64Kind:
			w.out = append(strconv.AppendUint(append(w.out, '"'), v, 10), '"')
		case protoreflect.EnumKind:
			if ev := fd.Enum().Values().ByNumber(protoreflect.EnumNumber(int32(v))); ev != nil {
				w.out = append(append(append(w.out, '"'), ev.Name()...), '"')
			} else {
				w.out = strconv.AppendInt(w.out, int64(int32(v)), 10)
			}
		default:
			return 0, errSlowPath
		}
		return n, nil
	case protowire.Fixed32Type:
		if len(b) < 4 {
			return 0, errTruncated
		}
		v := binary.LittleEndian.Uint32(b)
		switch k {
		case protoreflect.Fixed32Kind:
			w.out = strconv.AppendUint(w.out, uint64(v), 10)
		case protoreflect.Sfixed32Kind:
			w.out = strconv.AppendInt(w.out, int64(int32(v)), 10)
		default:
			w.out = appendProtoFloat(w.out, float64(math.Float32frombits(v)), 32)
		}
		return 4, nil
	case protowire.Fixed64Type:
		if len(b) < 8 {
			return 0, errTruncated
		}
		v := binary.LittleEndian.Uint64(b)
		switch k {
		case protoreflect.Fixed64Kind:
			w.out = append(strconv.AppendUint(append(w.out, '"'), v, 10), '"')
		case protoreflect.Sfixed64Kind:
			w.out = append(strconv.AppendInt(append(w.out, '"'), int64(v), 10), '"')
		default:
			w.out = appendProtoFloat(w.out, math.Float64frombits(v), 64)
		}
		return 8, nil
	}
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, protowire.ParseError(n)
	}
	switch k {
	case protoreflect.StringKind:
		if !utf8.Valid(v) {
			return 0, fmt.Errorf("field %s: string is not valid UTF-8", fd.Name())
		}
		w.out = jsonstr.Append(w.out, v)
	case protoreflect.BytesKind:
		w.out = append(w.out, '"')
		w.out = base64.StdEncoding.AppendEncode(w.out, v)
		w.out = append(w.out, '"')
	default:
		if err := w.message(fd.Message(), v); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// appendProtoFloat writes f as protojson does: ES6 number formatting,
// and "NaN", "Infinity", "-Infinity" as strings.
func appendProtoFloat(b []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(b, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(b, `"-Infinity"`...)
	}
	fmtByte := byte('f')
	if abs := math.Abs(f); abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			fmtByte = 'e'
		}
	}
	b = strconv.AppendFloat(b, f, fmtByte, -1, bits)
	if fmtByte == 'e' {
		// clean up e-09 to e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
