package schema

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/kpar/kpar/internal/jsonstr"
)

// Avro to JSON. The decoder walks the writer's schema over the binary
// encoding and writes JSON as it goes, with no value tree in between:
//
//	record          object, fields in schema order
//	union           the branch's value, without {"type": value}
//	enum            its symbol
//	int, long       number, exact
//	float, double   number; NaN and infinities as "NaN", "Infinity", "-Infinity"
//	bytes, fixed    standard base64
//	string          string
//	array, map      array, object
//	decimal         string, e.g. "123.45"
//	uuid            string
//	date            "YYYY-MM-DD"
//	timestamp-millis, timestamp-micros    RFC 3339 in UTC: "2024-05-06T07:08:09.123Z"
//	local-timestamp-millis, -micros       the same without the Z
//	time-millis, time-micros              number, as written
//
// Every read is checked against the bytes left, and the work done is
// bounded by the input's length (budget), so no input makes it allocate or
// loop without bound.

// maxDepth bounds nesting: a recursive schema nests as deep as its data.
const maxDepth = 256

var errTruncated = errors.New("truncated input")

type avroDecoder struct {
	b      []byte
	out    []byte
	budget int // values left to decode
	depth  int
}

// avroToJSON decodes payload, written with s, to JSON.
func avroToJSON(s avro.Schema, payload []byte) ([]byte, error) {
	d := avroDecoder{b: payload, out: make([]byte, 0, 2*len(payload)+16), budget: 64*len(payload) + 1024}
	if err := d.value(s); err != nil {
		return nil, err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%d bytes left after the value", len(d.b))
	}
	return d.out, nil
}

func (d *avroDecoder) long() (int64, error) {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		return 0, errTruncated
	}
	d.b = d.b[n:]
	return v, nil
}

func (d *avroDecoder) take(n int64) ([]byte, error) {
	if n < 0 || n > int64(len(d.b)) {
		return nil, fmt.Errorf("length %d out of range (%d bytes left)", n, len(d.b))
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v, nil
}

func (d *avroDecoder) value(s avro.Schema) error {
	if d.budget--; d.budget < 0 {
		return errors.New("too many values for the input's length")
	}
	if d.depth++; d.depth > maxDepth {
		return fmt.Errorf("nested deeper than %d", maxDepth)
	}
	defer func() { d.depth-- }()
	switch s := s.(type) {
	case *avro.RefSchema:
		return d.value(s.Schema())
	case *avro.RecordSchema:
		d.out = append(d.out, '{')
		for i, f := range s.Fields() {
			if i > 0 {
				d.out = append(d.out, ',')
			}
			d.out = jsonstr.Append(d.out, f.Name())
			d.out = append(d.out, ':')
			if err := d.value(f.Type()); err != nil {
				return fmt.Errorf("%s: %w", f.Name(), err)
			}
		}
		d.out = append(d.out, '}')
		return nil
	case *avro.UnionSchema:
		i, err := d.long()
		if err != nil {
			return err
		}
		ts := s.Types()
		if i < 0 || i >= int64(len(ts)) {
			return fmt.Errorf("union branch %d out of range (%d branches)", i, len(ts))
		}
		return d.value(ts[i])
	case *avro.EnumSchema:
		i, err := d.long()
		if err != nil {
			return err
		}
		syms := s.Symbols()
		if i < 0 || i >= int64(len(syms)) {
			return fmt.Errorf("enum %s: symbol %d out of range (%d symbols)", s.FullName(), i, len(syms))
		}
		d.out = jsonstr.Append(d.out, syms[i])
		return nil
	case *avro.ArraySchema:
		d.out = append(d.out, '[')
		first := true
		err := d.blocks(func() error {
			if !first {
				d.out = append(d.out, ',')
			}
			first = false
			return d.value(s.Items())
		})
		d.out = append(d.out, ']')
		return err
	case *avro.MapSchema:
		d.out = append(d.out, '{')
		first := true
		err := d.blocks(func() error {
			if !first {
				d.out = append(d.out, ',')
			}
			first = false
			n, err := d.long()
			if err != nil {
				return err
			}
			k, err := d.take(n)
			if err != nil {
				return err
			}
			d.out = jsonstr.Append(d.out, k)
			d.out = append(d.out, ':')
			return d.value(s.Values())
		})
		d.out = append(d.out, '}')
		return err
	case *avro.FixedSchema:
		v, err := d.take(int64(s.Size()))
		if err != nil {
			return err
		}
		return d.bytes(v, s.Logical())
	case *avro.PrimitiveSchema:
		return d.primitive(s)
	case *avro.NullSchema:
		d.out = append(d.out, "null"...)
		return nil
	}
	return fmt.Errorf("unsupported schema type %s", s.Type())
}

// blocks reads an array's or a map's blocks, calling item for each item.
func (d *avroDecoder) blocks(item func() error) error {
	for {
		n, err := d.long()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if n < 0 {
			if n == math.MinInt64 {
				return errors.New("block count out of range")
			}
			n = -n
			if _, err := d.long(); err != nil { // the block's size in bytes
				return err
			}
		}
		if n > int64(d.budget) {
			return fmt.Errorf("block of %d items is more than the input can hold", n)
		}
		for ; n > 0; n-- {
			if err := item(); err != nil {
				return err
			}
		}
	}
}

func (d *avroDecoder) bytes(v []byte, l avro.LogicalSchema) error {
	if l != nil {
		switch l.Type() {
		case avro.Decimal:
			if dl, ok := l.(*avro.DecimalLogicalSchema); ok {
				d.out = appendDecimal(d.out, v, dl.Scale())
				return nil
			}
		case avro.UUID:
			if len(v) == 16 {
				d.out = append(d.out, '"')
				d.out = append(d.out, formatGUID(v)...)
				d.out = append(d.out, '"')
				return nil
			}
		}
	}
	d.out = append(d.out, '"')
	d.out = base64.StdEncoding.AppendEncode(d.out, v)
	d.out = append(d.out, '"')
	return nil
}

func (d *avroDecoder) primitive(s *avro.PrimitiveSchema) error {
	var lt avro.LogicalType
	if l := s.Logical(); l != nil {
		lt = l.Type()
	}
	switch s.Type() {
	case avro.Null:
		d.out = append(d.out, "null"...)
	case avro.Boolean:
		v, err := d.take(1)
		if err != nil {
			return err
		}
		switch v[0] {
		case 0:
			d.out = append(d.out, "false"...)
		case 1:
			d.out = append(d.out, "true"...)
		default:
			return fmt.Errorf("boolean byte %d is neither 0 nor 1", v[0])
		}
	case avro.Int, avro.Long:
		v, err := d.long()
		if err != nil {
			return err
		}
		if s.Type() == avro.Int && (v < math.MinInt32 || v > math.MaxInt32) {
			return fmt.Errorf("int %d out of range", v)
		}
		switch lt {
		case avro.Date:
			if v < -1e7 || v > 1e7 {
				return fmt.Errorf("date %d days from 1970 out of range", v)
			}
			d.out = append(d.out, '"')
			d.out = time.Unix(v*86400, 0).UTC().AppendFormat(d.out, "2006-01-02")
			d.out = append(d.out, '"')
		case avro.TimestampMillis, avro.LocalTimestampMillis:
			d.out = appendTime(d.out, time.UnixMilli(v), lt == avro.TimestampMillis)
		case avro.TimestampMicros, avro.LocalTimestampMicros:
			d.out = appendTime(d.out, time.UnixMicro(v), lt == avro.TimestampMicros)
		default:
			d.out = strconv.AppendInt(d.out, v, 10)
		}
	case avro.Float:
		v, err := d.take(4)
		if err != nil {
			return err
		}
		d.out = appendFloat(d.out, float64(math.Float32frombits(binary.LittleEndian.Uint32(v))), 32)
	case avro.Double:
		v, err := d.take(8)
		if err != nil {
			return err
		}
		d.out = appendFloat(d.out, math.Float64frombits(binary.LittleEndian.Uint64(v)), 64)
	case avro.String, avro.Bytes:
		n, err := d.long()
		if err != nil {
			return err
		}
		v, err := d.take(n)
		if err != nil {
			return err
		}
		if s.Type() == avro.String {
			d.out = jsonstr.Append(d.out, v)
			return nil
		}
		return d.bytes(v, s.Logical())
	default:
		return fmt.Errorf("unsupported type %s", s.Type())
	}
	return nil
}

func appendTime(b []byte, t time.Time, zoned bool) []byte {
	b = append(b, '"')
	if zoned {
		b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	} else {
		b = t.UTC().AppendFormat(b, "2006-01-02T15:04:05.999999999")
	}
	return append(b, '"')
}

func appendFloat(b []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(b, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(b, `"-Infinity"`...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, bits)
}

// appendDecimal appends the decimal whose unscaled value is v, big-endian
// two's complement, as a JSON string.
func appendDecimal(b []byte, v []byte, scale int) []byte {
	n := new(big.Int).SetBytes(v)
	if len(v) > 0 && v[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(v))))
	}
	s := n.String()
	neg := ""
	if s[0] == '-' {
		neg, s = "-", s[1:]
	}
	if scale > 0 {
		for len(s) <= scale {
			s = "0" + s
		}
		s = s[:len(s)-scale] + "." + s[len(s)-scale:]
	}
	b = append(b, '"')
	b = append(b, neg...)
	b = append(b, s...)
	return append(b, '"')
}
