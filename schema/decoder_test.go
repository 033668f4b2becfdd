package schema

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/forward"
)

const orderAvro = `{"type":"record","name":"Order","namespace":"shop","fields":[
 {"name":"id","type":"long"},
 {"name":"note","type":["null","string"]},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
 {"name":"blob","type":"bytes"},
 {"name":"hash","type":{"type":"fixed","name":"Hash","size":4}},
 {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"atMicros","type":{"type":"long","logicalType":"timestamp-micros"}},
 {"name":"day","type":{"type":"int","logicalType":"date"}},
 {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
 {"name":"uid","type":{"type":"string","logicalType":"uuid"}},
 {"name":"tags","type":{"type":"array","items":"string"}},
 {"name":"attrs","type":{"type":"map","values":"int"}},
 {"name":"ratio","type":"double"}
]}`

// newTestRegistry is an in-memory registry and a client of it.
func newTestRegistry(t *testing.T, opts ...Opt) (*srfake.Registry, *Registry) {
	t.Helper()
	fake := srfake.New()
	t.Cleanup(fake.Close)
	reg, err := New(fake.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	return fake, reg
}

func wire(id int, payload []byte) []byte { return append(appendPrefix(nil, id), payload...) }

func decodeJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("not JSON: %q: %v", b, err)
	}
	return m
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAvroDecodesToPlainJSONPerTheMapping(t *testing.T) {
	fake, reg := newTestRegistry(t)
	id, _, err := fake.RegisterSchema("orders-value", sr.Schema{Schema: orderAvro})
	if err != nil {
		t.Fatal(err)
	}
	s := avro.MustParse(orderAvro)
	at := time.Date(2024, 5, 6, 7, 8, 9, 123e6, time.UTC)
	note := "first"
	payload, err := avro.Marshal(s, map[string]any{
		"id": int64(1) << 60, "note": &note, "status": "PAID",
		"blob": []byte{0, 1, 2}, "hash": [4]byte{9, 8, 7, 6},
		"at": at, "atMicros": at.Add(456 * time.Microsecond), "day": time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
		"price": big.NewRat(-12345, 100), "uid": "7d444840-9dc0-11d1-b245-5ffdce74fad2",
		"tags": []string{"a", "b"}, "attrs": map[string]int{"x": 1}, "ratio": 0.5,
	})
	if err != nil {
		t.Fatal(err)
	}
	d := NewDecoder(reg, DeadLetter)
	out, err := d.Decode(context.Background(), &kgo.Record{Value: wire(id, payload)})
	if err != nil {
		t.Fatal(err)
	}
	if out.ValueForm != forward.FormAvro || out.ValueSchemaID != id {
		t.Errorf("form %s id %d, want avro %d", out.ValueForm, out.ValueSchemaID, id)
	}
	got := decodeJSON(t, out.Value)
	want := map[string]any{
		"id": json.Number("1152921504606846976"), "note": "first", "status": "PAID",
		"blob": base64.StdEncoding.EncodeToString([]byte{0, 1, 2}), "hash": base64.StdEncoding.EncodeToString([]byte{9, 8, 7, 6}),
		"at": "2024-05-06T07:08:09.123Z", "atMicros": "2024-05-06T07:08:09.123456Z", "day": "2024-02-29",
		"price": "-123.45", "uid": "7d444840-9dc0-11d1-b245-5ffdce74fad2",
		"tags": []any{"a", "b"}, "attrs": map[string]any{"x": json.Number("1")}, "ratio": json.Number("0.5"),
	}
	for k, w := range want {
		if !reflect.DeepEqual(got[k], w) {
			t.Errorf("%s = %#v, want %#v", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d fields, want %d: %s", len(got), len(want), out.Value)
	}
}

func TestAvroNullUnionBranchIsNull(t *testing.T) {
	fake, reg := newTestRegistry(t)
	schema := `{"type":"record","name":"R","fields":[{"name":"n","type":["null","long"]}]}`
	id, _, _ := fake.RegisterSchema("r-value", sr.Schema{Schema: schema})
	out, err := NewDecoder(reg, DeadLetter).Decode(context.Background(), &kgo.Record{Value: wire(id, []byte{0})})
	if err != nil || string(out.Value) != `{"n":null}` {
		t.Errorf("got %s, %v; want {\"n\":null}", out.Value, err)
	}
}

const protoFile = `syntax = "proto3";
package shop;
import "shop/money.proto";
message Header { string source = 1; }
message Order {
  enum Kind { KIND_UNSPECIFIED = 0; ONLINE = 1; }
  message Line { string sku = 1; int32 qty = 2; }
  int64 id = 1;
  repeated Line lines = 2;
  Kind kind = 3;
  Money total = 4;
  map<string, int32> counts = 5;
  map<int64, Line> byId = 6;
  optional string coupon = 7;
  double ratio = 8;
}
`

const moneyFile = `syntax = "proto3";
package shop;
message Money { string currency = 1; int64 units = 2; }
`

// protoMessage compiles the test files and returns the message at idx.
func protoMessage(t *testing.T, idx ...int) protoreflect.MessageDescriptor {
	t.Helper()
	comp := protocompile.Compiler{Resolver: &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(map[string]string{
		"main.proto": protoFile, "shop/money.proto": moneyFile,
	})}}
	fds, err := comp.Compile(context.Background(), "main.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := fds[0].Messages().Get(idx[0])
	for _, i := range idx[1:] {
		md = md.Messages().Get(i)
	}
	return md
}

func registerProto(t *testing.T, fake *srfake.Registry) int {
	t.Helper()
	if _, _, err := fake.RegisterSchema("shop/money.proto", sr.Schema{Schema: moneyFile, Type: sr.TypeProtobuf}); err != nil {
		t.Fatal(err)
	}
	id, _, err := fake.RegisterSchema("orders-value", sr.Schema{Schema: protoFile, Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "shop/money.proto", Subject: "shop/money.proto", Version: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestProtobufDecodesTheMessageItsIndexesNameAsProtojson(t *testing.T) {
	fake, reg := newTestRegistry(t)
	id := registerProto(t, fake)
	md := protoMessage(t, 1)
	m := dynamicpb.NewMessage(md)
	if err := protojson.Unmarshal([]byte(`{"id":"42","lines":[{"sku":"a","qty":2},{"sku":"b"}],"kind":"ONLINE","total":{"currency":"EUR","units":"12"},"counts":{"x":3,"y":0},"byId":{"7":{"sku":"z"}},"coupon":"","ratio":1e-7}`), m); err != nil {
		t.Fatal(err)
	}
	payload, _ := proto.Marshal(m)
	b := appendIndexes(appendPrefix(nil, id), []int{1})
	out, err := NewDecoder(reg, DeadLetter).Decode(context.Background(), &kgo.Record{Value: append(b, payload...)})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := protojson.Marshal(m)
	if !reflect.DeepEqual(decodeJSON(t, out.Value), decodeJSON(t, want)) || out.ValueForm != forward.FormProtobuf {
		t.Errorf("got %s (%s), want %s", out.Value, out.ValueForm, want)
	}

	// The first message is a lone 0.
	h := dynamicpb.NewMessage(protoMessage(t, 0))
	h.Set(h.Descriptor().Fields().ByName("source"), protoreflect.ValueOfString("web"))
	payload, _ = proto.Marshal(h)
	out, err = NewDecoder(reg, DeadLetter).Decode(context.Background(), &kgo.Record{Value: append(appendIndexes(appendPrefix(nil, id), []int{0}), payload...)})
	if err != nil || string(out.Value) != `{"source":"web"}` && !strings.Contains(string(out.Value), `"web"`) {
		t.Errorf("first message: %s, %v", out.Value, err)
	}
	// A nested message: Order.Line is [1, 0].
	l := dynamicpb.NewMessage(protoMessage(t, 1, 0))
	l.Set(l.Descriptor().Fields().ByName("sku"), protoreflect.ValueOfString("z"))
	payload, _ = proto.Marshal(l)
	out, err = NewDecoder(reg, DeadLetter).Decode(context.Background(), &kgo.Record{Value: append(appendIndexes(appendPrefix(nil, id), []int{1, 0}), payload...)})
	if err != nil || decodeJSON(t, out.Value)["sku"] != "z" {
		t.Errorf("nested message: %s, %v", out.Value, err)
	}
}

func TestJSONSchemaValueIsSentAsWrittenAndValidatedOnlyWhenAsked(t *testing.T) {
	schema := `{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`
	for _, validate := range []bool{false, true} {
		var opts []Opt
		if validate {
			opts = append(opts, Validate())
		}
		fake, reg := newTestRegistry(t, opts...)
		id, _, _ := fake.RegisterSchema("j-value", sr.Schema{Schema: schema, Type: sr.TypeJSON})
		d := NewDecoder(reg, DeadLetter)
		out, err := d.Decode(context.Background(), &kgo.Record{Value: wire(id, []byte(`{"n": 1}`))})
		if err != nil || string(out.Value) != `{"n": 1}` || out.ValueForm != forward.FormJSONSchema {
			t.Errorf("validate %v: got %s %s, %v", validate, out.Value, out.ValueForm, err)
		}
		_, err = d.Decode(context.Background(), &kgo.Record{Value: wire(id, []byte(`{"n": "x"}`))})
		if validate != (err != nil) {
			t.Errorf("validate %v: a value that breaks its schema: err = %v", validate, err)
		}
		if err != nil && (!kpar.IsPermanent(err) || !strings.Contains(err.Error(), "deserialization error")) {
			t.Errorf("err = %v, want a permanent deserialization error", err)
		}
	}
}

func TestDecodeFailures(t *testing.T) {
	fake, reg := newTestRegistry(t)
	id, _, _ := fake.RegisterSchema("r-value", sr.Schema{Schema: `{"type":"record","name":"R","fields":[{"name":"s","type":"string"}]}`})
	ctx := context.Background()
	for name, tc := range map[string]struct {
		value     []byte
		u         Undecodable
		permanent string // "" when it decodes
	}{
		"unknown schema ID":           {wire(999, []byte{2, 'a'}), DeadLetter, "schema not found"},
		"bytes that do not decode":    {wire(id, []byte{40, 'a'}), DeadLetter, "deserialization error"},
		"not in the wire format":      {[]byte(`{"plain":"json"}`), DeadLetter, "not in the Confluent wire format"},
		"not in the wire format, raw": {[]byte(`{"plain":"json"}`), Raw, ""},
		"GUID the registry lacks":     {append([]byte{1}, make([]byte, 16)...), DeadLetter, "magic byte 1"},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := NewDecoder(reg, tc.u).Decode(ctx, &kgo.Record{Value: tc.value})
			if tc.permanent == "" {
				if err != nil || out.ValueForm != forward.FormRaw || string(out.Value) != string(tc.value) {
					t.Errorf("got %s %q, %v; want the raw value", out.ValueForm, out.Value, err)
				}
				return
			}
			if !kpar.IsPermanent(err) || !strings.Contains(err.Error(), tc.permanent) {
				t.Errorf("err = %v, want a permanent error saying %q", err, tc.permanent)
			}
		})
	}
}

func TestRegistryOutageIsAnOverloadThatNamesTheRegistry(t *testing.T) {
	fake, reg := newTestRegistry(t, Timeout(30*time.Second))
	id, _, _ := fake.RegisterSchema("r-value", sr.Schema{Schema: `"string"`})
	var down atomic.Bool
	down.Store(true)
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusInternalServerError} {
		fake.ClearInterceptors()
		fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
			if !down.Load() {
				return false
			}
			w.WriteHeader(code)
			return true
		})
		_, err := NewDecoder(reg, DeadLetter).Decode(context.Background(), &kgo.Record{Value: wire(id, []byte{2, 'a'})})
		if !kpar.IsOverloaded(err) || kpar.IsPermanent(err) || !strings.Contains(err.Error(), fake.URL()) {
			t.Errorf("%d: err = %v, want an overload naming %s", code, err, fake.URL())
		}
	}
	down.Store(false)
	out, err := NewDecoder(reg, DeadLetter).Decode(context.Background(), &kgo.Record{Value: wire(id, []byte{2, 'a'})})
	if err != nil || string(out.Value) != `"a"` {
		t.Errorf("after the outage: %s, %v", out.Value, err)
	}
	// Cached now: another outage does not touch it.
	down.Store(true)
	if _, err := NewDecoder(reg, DeadLetter).Decode(context.Background(), &kgo.Record{Value: wire(id, []byte{2, 'b'})}); err != nil {
		t.Errorf("cached schema during an outage: %v", err)
	}

	unreachable, _ := New("http://127.0.0.1:1")
	defer unreachable.Close()
	_, err = NewDecoder(unreachable, DeadLetter).Decode(context.Background(), &kgo.Record{Value: wire(id, nil)})
	if !kpar.IsOverloaded(err) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("unreachable: err = %v, want an overload naming it", err)
	}
}

func TestSchemaIdentityInAHeaderOrAsAGUID(t *testing.T) {
	fake, reg := newTestRegistry(t)
	id, _, _ := fake.RegisterSchema("r-value", sr.Schema{Schema: `"string"`})
	ss, err := reg.cl.SchemaByVersion(context.Background(), "r-value", 1)
	if err != nil || ss.GUID == "" {
		t.Fatalf("no GUID: %v %+v", err, ss)
	}
	guid := guidBytes(t, ss.GUID)
	d := NewDecoder(reg, DeadLetter)
	for name, r := range map[string]*kgo.Record{
		"magic byte 1":       {Value: append(append([]byte{1}, guid...), 2, 'g')},
		"GUID in a header":   {Value: []byte{2, 'g'}, Headers: []kgo.RecordHeader{{Key: HeaderValueSchemaID, Value: append([]byte{1}, guid...)}}},
		"ID in a header":     {Value: []byte{2, 'g'}, Headers: []kgo.RecordHeader{{Key: HeaderValueSchemaID, Value: appendPrefix(nil, id)}}},
		"key in wire format": {Key: wire(id, []byte{2, 'k'}), Value: wire(id, []byte{2, 'g'})},
	} {
		out, err := d.Decode(context.Background(), r)
		if err != nil || string(out.Value) != `"g"` || out.ValueSchemaID != id {
			t.Errorf("%s: got %s id %d, %v", name, out.Value, out.ValueSchemaID, err)
		}
		if r.Key != nil && string(out.Key) != `"k"` {
			t.Errorf("%s: key %s", name, out.Key)
		}
	}
}

func guidBytes(t *testing.T, s string) []byte {
	t.Helper()
	b := make([]byte, 0, 16)
	h := strings.ReplaceAll(s, "-", "")
	for i := 0; i+1 < len(h); i += 2 {
		var v byte
		for _, c := range h[i : i+2] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= byte(c - '0')
			case c >= 'a' && c <= 'f':
				v |= byte(c-'a') + 10
			}
		}
		b = append(b, v)
	}
	if len(b) != 16 {
		t.Fatalf("GUID %q", s)
	}
	return b
}

func TestReplyEncoderWritesTheWireFormatOrRefusesAMisfit(t *testing.T) {
	fake, reg := newTestRegistry(t)
	ctx := context.Background()
	id, _, _ := fake.RegisterSchema("out-value", sr.Schema{Schema: orderAvro})
	if _, err := NewReplyEncoder(ctx, reg, "missing", -1); !kpar.IsPermanent(err) {
		t.Errorf("unknown subject: %v, want schema not found", err)
	}
	e, err := NewReplyEncoder(ctx, reg, "out-value", -1)
	if err != nil {
		t.Fatal(err)
	}
	in := `{"id":1152921504606846977,"note":null,"status":"NEW","blob":"AAEC","hash":"CQgHBg==","at":"2024-05-06T07:08:09.123Z","atMicros":"2024-05-06T07:08:09.123456Z","day":"2024-02-29","price":"-123.45","uid":"7d444840-9dc0-11d1-b245-5ffdce74fad2","tags":["a"],"attrs":{"x":1},"ratio":0.5}`
	b, err := e.EncodeReply(ctx, &kgo.Record{}, []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != id {
		t.Errorf("prefix % x, want magic 0 and ID %d", b[:5], id)
	}
	out, err := NewDecoder(reg, DeadLetter).Decode(ctx, &kgo.Record{Value: b})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(decodeJSON(t, out.Value), decodeJSON(t, []byte(in))) {
		t.Errorf("round trip:\n got %s\nwant %s", out.Value, in)
	}
	if _, err := e.EncodeReply(ctx, &kgo.Record{}, []byte(`{"id":"not a long"}`)); !kpar.IsPermanent(err) || !strings.Contains(err.Error(), "does not fit") {
		t.Errorf("misfit: %v", err)
	}
}

func TestRegistryAuthAndTLS(t *testing.T) {
	schema := sr.Schema{Schema: `"string"`}
	for name, tc := range map[string]struct {
		auth string // srfake.WithAuth's value
		opts []Opt
		ok   bool
	}{
		"bearer token":       {"Bearer s3cret", []Opt{BearerToken("s3cret")}, true},
		"basic auth":         {"Basic " + base64.StdEncoding.EncodeToString([]byte("key:secret")), []Opt{BasicAuth("key", "secret")}, true},
		"wrong token":        {"Bearer s3cret", []Opt{BearerToken("nope")}, false},
		"no credentials":     {"Bearer s3cret", nil, false},
		"credentials in URL": {"Basic " + base64.StdEncoding.EncodeToString([]byte("key:secret")), nil, true},
	} {
		t.Run(name, func(t *testing.T) {
			fake := srfake.NewRegistry(srfake.WithAuth(tc.auth))
			id, _, _ := fake.RegisterSchema("s-value", schema)
			srv := httptest.NewTLSServer(fake.Handler())
			t.Cleanup(srv.Close)
			pool := x509.NewCertPool()
			pool.AddCert(srv.Certificate())
			url := srv.URL
			if name == "credentials in URL" {
				url = strings.Replace(url, "https://", "https://key:secret@", 1)
			}
			reg, err := New(url, append(tc.opts, TLSConfig(&tls.Config{RootCAs: pool}))...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(reg.Close)
			if strings.Contains(reg.URL(), "secret") {
				t.Errorf("URL() shows the password: %s", reg.URL())
			}
			out, err := NewDecoder(reg, DeadLetter).Decode(context.Background(), &kgo.Record{Value: wire(id, []byte{2, 'a'})})
			if tc.ok && (err != nil || string(out.Value) != `"a"`) {
				t.Errorf("got %s, %v", out.Value, err)
			}
			if !tc.ok && (!kpar.IsOverloaded(err) || !strings.Contains(err.Error(), "credentials")) {
				t.Errorf("refused credentials: err = %v, want an overload that says to check the credentials", err)
			}
		})
	}
}

func TestProtobufWellKnownTypesTakeProtojsonsForms(t *testing.T) {
	fake, reg := newTestRegistry(t)
	id, _, err := fake.RegisterSchema("e-value", sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3";
package ev;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Event { google.protobuf.Timestamp at = 1; google.protobuf.StringValue note = 2; }
`})
	if err != nil {
		t.Fatal(err)
	}
	// at = {seconds: 1714979289, nanos: 123000000}, note = "hi"
	at := protowire.AppendTag(nil, 1, protowire.VarintType)
	at = protowire.AppendVarint(at, 1714979289)
	at = protowire.AppendVarint(protowire.AppendTag(at, 2, protowire.VarintType), 123000000)
	b := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), at)
	note := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "hi")
	b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), note)
	out, err := NewDecoder(reg, DeadLetter).Decode(context.Background(), &kgo.Record{Value: append(appendIndexes(appendPrefix(nil, id), []int{0}), b...)})
	if err != nil {
		t.Fatal(err)
	}
	got := decodeJSON(t, out.Value)
	if got["at"] != "2024-05-06T07:08:09.123Z" || got["note"] != "hi" {
		t.Errorf("got %s, want the Timestamp as RFC 3339 and the wrapper as its value", out.Value)
	}
}
