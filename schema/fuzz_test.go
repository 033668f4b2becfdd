package schema

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The fuzz targets check that no input panics, and that what an input
// yields is bounded by its length (no unbounded allocation).

func FuzzWireFormat(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0})
	f.Add(append([]byte{1}, make([]byte, 17)...))
	f.Add([]byte{0, 0, 0, 0, 1, 4, 2, 6})
	f.Add([]byte{0x7f})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, rest, err := parsePrefix(b)
		if err != nil {
			return
		}
		idx, _, err := parseIndexes(rest)
		if err == nil && len(idx) > maxIndexes {
			t.Fatalf("%d indexes", len(idx))
		}
	})
}

func FuzzAvroDecode(f *testing.F) {
	s := avro.MustParse(orderAvro)
	list := avro.MustParse(`{"type":"record","name":"L","fields":[{"name":"next","type":["null","L"]},{"name":"xs","type":{"type":"array","items":"null"}},{"name":"m","type":{"type":"map","values":["null","double"]}}]}`)
	f.Add([]byte{2, 0, 2, 4, 1, 2, 3})
	f.Add([]byte{2, 2, 0, 1, 0})
	f.Add([]byte{0, 0x81, 0x80, 0x80, 0x80, 0x10, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, sc := range []avro.Schema{s, list} {
			out, err := avroToJSON(sc, b)
			if err == nil && len(out) > 256*len(b)+4096 {
				t.Fatalf("%d bytes of JSON from %d bytes", len(out), len(b))
			}
		}
	})
}

func FuzzProtobufDecode(f *testing.F) {
	c, err := compile(1, sr.Schema{Schema: protoFile, Type: sr.TypeProtobuf}, []reference{{"shop/money.proto", sr.Schema{Schema: moneyFile, Type: sr.TypeProtobuf}}})
	if err != nil {
		f.Fatal(err)
	}
	md, _ := c.message([]int{1})
	m := dynamicpb.NewMessage(md)
	_ = protojson.Unmarshal([]byte(`{"id":"42","lines":[{"sku":"a","qty":2}],"kind":"ONLINE"}`), m)
	seed, _ := proto.Marshal(m)
	f.Add(append([]byte{2, 2}, seed...))
	f.Add([]byte{0, 8, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		idx, rest, err := parseIndexes(b)
		if err != nil {
			return
		}
		out, err := c.decode(rest, idx, false)
		if err == nil && len(out) > 256*len(b)+4096 {
			t.Fatalf("%d bytes of JSON from %d bytes", len(out), len(b))
		}
	})
}

func FuzzJSONSchemaDecode(f *testing.F) {
	c, err := compile(1, sr.Schema{Schema: `{"type":"object","properties":{"n":{"type":"integer"}}}`, Type: sr.TypeJSON}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(`{"n":1}`))
	f.Add([]byte(`[[[[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := c.decode(b, nil, true)
		if err == nil && len(out) != len(b) {
			t.Fatalf("JSON changed: %q to %q", b, out)
		}
	})
}

// The whole Decoder on any value, against a registry that knows one
// schema of each kind.
func FuzzDecoder(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 2, 'a'})
	f.Add([]byte{0, 0, 0, 0, 2, 0, 8, 1})
	f.Add([]byte{0, 0, 0, 0, 3, '{', '}'})
	reg, err := New("http://127.0.0.1:1")
	if err != nil {
		f.Fatal(err)
	}
	for id, s := range map[int]sr.Schema{
		1: {Schema: orderAvro},
		2: {Schema: protoFile, Type: sr.TypeProtobuf},
		3: {Schema: `{"type":"object"}`, Type: sr.TypeJSON},
	} {
		var refs []reference
		if s.Type == sr.TypeProtobuf {
			refs = []reference{{"shop/money.proto", sr.Schema{Schema: moneyFile, Type: sr.TypeProtobuf}}}
		}
		c, err := compile(id, s, refs)
		if err != nil {
			f.Fatal(err)
		}
		reg.byID[id] = c
	}
	d := NewDecoder(reg, DeadLetter)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 5 && b[0] == 0 {
			b[1], b[2], b[3] = 0, 0, 0 // keep to the known IDs: no registry round trip per input
			if b[4] > 3 || b[4] == 0 {
				b[4] = 1
			}
		}
		if len(b) > 0 && b[0] == 1 {
			b[0] = 2 // no GUIDs: they would ask the registry
		}
		out, err := d.Decode(context.Background(), &kgo.Record{Value: b})
		if err == nil && len(out.Value) > 256*len(b)+4096 {
			t.Fatalf("%d bytes of JSON from %d bytes", len(out.Value), len(b))
		}
	})
}

// The Protobuf fast path writes what the reference (dynamicpb and
// protojson) writes, for any bytes both read.
func FuzzProtobufFastPathMatchesProtojson(f *testing.F) {
	c, err := compile(1, sr.Schema{Schema: protoFile, Type: sr.TypeProtobuf}, []reference{{"shop/money.proto", sr.Schema{Schema: moneyFile, Type: sr.TypeProtobuf}}})
	if err != nil {
		f.Fatal(err)
	}
	md, _ := c.message([]int{1})
	m := dynamicpb.NewMessage(md)
	_ = protojson.Unmarshal([]byte(`{"id":"-42","lines":[{"sku":"a","qty":2},{"sku":"é"}],"kind":"ONLINE","total":{"currency":"EUR","units":"12"}}`), m)
	seed, _ := proto.Marshal(m)
	f.Add(seed)
	f.Add([]byte{0x08, 0x01, 0x08, 0x02})
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ferr := protoToJSON(md, b)
		if ferr == errSlowPath {
			return
		}
		ref := dynamicpb.NewMessage(md)
		rerr := proto.Unmarshal(b, ref)
		var want []byte
		if rerr == nil {
			want, rerr = protojson.Marshal(ref)
		}
		if (ferr == nil) != (rerr == nil) {
			t.Fatalf("fast path err %v, reference err %v (fast %s)", ferr, rerr, fast)
		}
		if ferr != nil {
			return
		}
		var a, w any
		if err := json.Unmarshal(fast, &a); err != nil {
			t.Fatalf("fast path wrote %q: %v", fast, err)
		}
		_ = json.Unmarshal(want, &w)
		if !reflect.DeepEqual(a, w) {
			t.Fatalf("fast path %s, protojson %s", fast, want)
		}
	})
}
