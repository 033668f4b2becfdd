package schema

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// JSON to Avro, for typed replies: the inverse of avroToJSON's mapping.
// A union takes the first branch the value fits; a record field missing
// from the JSON takes its default. Timestamps and dates take the strings
// the decoder writes or numbers; bytes and fixed take base64.

// jsonToAvro encodes the JSON text v with s.
func jsonToAvro(s avro.Schema, v []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	return encodeAvro(nil, s, x, 0)
}

func encodeAvro(b []byte, s avro.Schema, x any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxDepth)
	}
	depth++
	switch s := s.(type) {
	case *avro.RefSchema:
		return encodeAvro(b, s.Schema(), x, depth)
	case *avro.RecordSchema:
		m, ok := x.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("record %s: want an object, got %s", s.FullName(), kind(x))
		}
		for _, f := range s.Fields() {
			v, ok := m[f.Name()]
			if !ok {
				if !f.HasDefault() {
					return nil, fmt.Errorf("record %s: field %s missing (it has no default)", s.FullName(), f.Name())
				}
				v = normalize(f.Default())
			}
			var err error
			if b, err = encodeAvro(b, f.Type(), v, depth); err != nil {
				return nil, fmt.Errorf("%s: %w", f.Name(), err)
			}
		}
		return b, nil
	case *avro.UnionSchema:
		var errs []string
		for i, t := range s.Types() {
			out, err := encodeAvro(binary.AppendVarint(b, int64(i)), t, x, depth)
			if err == nil {
				return out, nil
			}
			errs = append(errs, err.Error())
		}
		return nil, fmt.Errorf("fits no branch of the union: %s", strings.Join(errs, "; "))
	case *avro.EnumSchema:
		str, ok := x.(string)
		if !ok {
			return nil, fmt.Errorf("enum %s: want a symbol, got %s", s.FullName(), kind(x))
		}
		for i, sym := range s.Symbols() {
			if sym == str {
				return binary.AppendVarint(b, int64(i)), nil
			}
		}
		return nil, fmt.Errorf("enum %s has no symbol %q", s.FullName(), str)
	case *avro.ArraySchema:
		xs, ok := x.([]any)
		if !ok {
			return nil, fmt.Errorf("want an array, got %s", kind(x))
		}
		if len(xs) > 0 {
			b = binary.AppendVarint(b, int64(len(xs)))
			for _, v := range xs {
				var err error
				if b, err = encodeAvro(b, s.Items(), v, depth); err != nil {
					return nil, err
				}
			}
		}
		return append(b, 0), nil
	case *avro.MapSchema:
		m, ok := x.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("want an object, got %s", kind(x))
		}
		if len(m) > 0 {
			b = binary.AppendVarint(b, int64(len(m)))
			for k, v := range m {
				b = binary.AppendVarint(b, int64(len(k)))
				b = append(b, k...)
				var err error
				if b, err = encodeAvro(b, s.Values(), v, depth); err != nil {
					return nil, err
				}
			}
		}
		return append(b, 0), nil
	case *avro.FixedSchema:
		raw, err := bytesOf(x, s.Logical(), s.Size())
		if err != nil {
			return nil, err
		}
		if len(raw) != s.Size() {
			return nil, fmt.Errorf("fixed %s: %d bytes, want %d", s.FullName(), len(raw), s.Size())
		}
		return append(b, raw...), nil
	case *avro.PrimitiveSchema:
		return encodePrimitive(b, s, x)
	case *avro.NullSchema:
		if x != nil {
			return nil, fmt.Errorf("want null, got %s", kind(x))
		}
		return b, nil
	}
	return nil, fmt.Errorf("unsupported schema type %s", s.Type())
}

func encodePrimitive(b []byte, s *avro.PrimitiveSchema, x any) ([]byte, error) {
	var lt avro.LogicalType
	if l := s.Logical(); l != nil {
		lt = l.Type()
	}
	switch s.Type() {
	case avro.Null:
		if x != nil {
			return nil, fmt.Errorf("want null, got %s", kind(x))
		}
		return b, nil
	case avro.Boolean:
		v, ok := x.(bool)
		if !ok {
			return nil, fmt.Errorf("want a boolean, got %s", kind(x))
		}
		if v {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case avro.Int, avro.Long:
		var n int64
		if str, ok := x.(string); ok {
			t, err := parseTimeFor(lt, str)
			if err != nil {
				return nil, err
			}
			switch lt {
			case avro.Date:
				n = t.Unix() / 86400
			case avro.TimestampMillis, avro.LocalTimestampMillis:
				n = t.UnixMilli()
			default:
				n = t.UnixMicro()
			}
		} else {
			num, ok := x.(json.Number)
			if !ok {
				return nil, fmt.Errorf("want a number, got %s", kind(x))
			}
			v, err := strconv.ParseInt(string(num), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("want an integer, got %s", num)
			}
			n = v
		}
		if s.Type() == avro.Int && (n < math.MinInt32 || n > math.MaxInt32) {
			return nil, fmt.Errorf("%d out of range for int", n)
		}
		return binary.AppendVarint(b, n), nil
	case avro.Float, avro.Double:
		var f float64
		switch v := x.(type) {
		case json.Number:
			var err error
			if f, err = strconv.ParseFloat(string(v), 64); err != nil {
				return nil, err
			}
		case string:
			switch v {
			case "NaN":
				f = math.NaN()
			case "Infinity":
				f = math.Inf(1)
			case "-Infinity":
				f = math.Inf(-1)
			default:
				return nil, fmt.Errorf("want a number, got %q", v)
			}
		default:
			return nil, fmt.Errorf("want a number, got %s", kind(x))
		}
		if s.Type() == avro.Float {
			return binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(f))), nil
		}
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(f)), nil
	case avro.String:
		v, ok := x.(string)
		if !ok {
			return nil, fmt.Errorf("want a string, got %s", kind(x))
		}
		b = binary.AppendVarint(b, int64(len(v)))
		return append(b, v...), nil
	case avro.Bytes:
		raw, err := bytesOf(x, s.Logical(), 0)
		if err != nil {
			return nil, err
		}
		b = binary.AppendVarint(b, int64(len(raw)))
		return append(b, raw...), nil
	}
	return nil, fmt.Errorf("unsupported type %s", s.Type())
}

func parseTimeFor(lt avro.LogicalType, s string) (time.Time, error) {
	switch lt {
	case avro.Date:
		return time.Parse("2006-01-02", s)
	case avro.TimestampMillis, avro.TimestampMicros:
		return time.Parse(time.RFC3339Nano, s)
	case avro.LocalTimestampMillis, avro.LocalTimestampMicros:
		return time.Parse("2006-01-02T15:04:05.999999999", s)
	}
	return time.Time{}, fmt.Errorf("want a number, got %q", s)
}

// bytesOf reads bytes, fixed or decimal from x: base64, or a decimal
// string or number for the decimal logical type.
func bytesOf(x any, l avro.LogicalSchema, size int) ([]byte, error) {
	if dl, ok := l.(*avro.DecimalLogicalSchema); ok {
		var str string
		switch v := x.(type) {
		case string:
			str = v
		case json.Number:
			str = string(v)
		default:
			return nil, fmt.Errorf("decimal: want a string, got %s", kind(x))
		}
		r, ok := new(big.Rat).SetString(str)
		if !ok {
			return nil, fmt.Errorf("decimal: %q is not a number", str)
		}
		r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(dl.Scale())), nil)))
		if !r.IsInt() {
			return nil, fmt.Errorf("decimal: %q has more than %d decimals", str, dl.Scale())
		}
		return twosComplement(r.Num(), size), nil
	}
	str, ok := x.(string)
	if !ok {
		return nil, fmt.Errorf("want base64 text, got %s", kind(x))
	}
	if l != nil && l.Type() == avro.UUID && size == 16 {
		raw, err := hex.DecodeString(strings.ReplaceAll(str, "-", ""))
		if err != nil || len(raw) != 16 {
			return nil, fmt.Errorf("uuid: %q is not a UUID", str)
		}
		return raw, nil
	}
	raw, err := base64.StdEncoding.DecodeString(str)
	if err != nil {
		return nil, fmt.Errorf("want base64 text: %w", err)
	}
	return raw, nil
}

// twosComplement is n big-endian in two's complement, in size bytes (0:
// as few as it takes).
func twosComplement(n *big.Int, size int) []byte {
	l := (n.BitLen() + 8) / 8
	if size > l {
		l = size
	}
	v := new(big.Int).Set(n)
	if n.Sign() < 0 {
		v.Add(v, new(big.Int).Lsh(big.NewInt(1), uint(8*l)))
	}
	return v.FillBytes(make([]byte, l))
}

// normalize turns a default value as hamba/avro parsed it into the shapes
// json.Decoder with UseNumber makes.
func normalize(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var x any
	if dec.Decode(&x) != nil {
		return v
	}
	return x
}

func kind(x any) string {
	switch x.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", x)
}
