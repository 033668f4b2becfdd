package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/kpar/kpar/deadletter"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// typedEndpoint keeps the body and headers of each request by its
// record's key.
type typedEndpoint struct {
	mu   sync.Mutex
	got  map[string]typedRequest // guarded by mu
	srv  *httptest.Server
	seen chan struct{} // receives after each request
}

type typedRequest struct {
	body   []byte
	header http.Header
}

func newTypedEndpoint(t *testing.T) *typedEndpoint {
	e := &typedEndpoint{got: map[string]typedRequest{}, seen: make(chan struct{}, 1024)}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		if len(body) > 0 && body[0] == '[' { // a batch: each item as if alone
			var items []struct {
				Key         []byte          `json:"key"`
				Value       json.RawMessage `json:"value"`
				ValueForm   string          `json:"value_form"`
				SchemaID    int             `json:"value_schema_id"`
				ContentType string          `json:"content_type"`
			}
			_ = json.Unmarshal(body, &items)
			for _, it := range items {
				e.got[string(it.Key)] = typedRequest{it.Value, http.Header{
					"Content-Type": {it.ContentType}, "Kpar-Value-Form": {it.ValueForm}, "Kpar-Schema-Id": {fmt.Sprint(it.SchemaID)},
				}}
			}
		} else {
			key, _ := base64.StdEncoding.DecodeString(r.Header.Get("Kpar-Key"))
			e.got[string(key)] = typedRequest{body, r.Header.Clone()}
		}
		e.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
		select {
		case e.seen <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// await waits until n distinct records arrived.
func (e *typedEndpoint) await(ctx context.Context, t *testing.T, n int, p *process) map[string]typedRequest {
	t.Helper()
	for {
		e.mu.Lock()
		if len(e.got) >= n {
			out := e.got
			e.mu.Unlock()
			return out
		}
		have := len(e.got)
		e.mu.Unlock()
		select {
		case <-e.seen:
		case <-ctx.Done():
			t.Fatalf("the endpoint got %d of %d records: %v\nkpar forward:\n%s", have, n, ctx.Err(), tail(p.stderr))
		}
	}
}

// registryURL waits for kpar broker's registry line and returns its URL.
func registryURL(ctx context.Context, t *testing.T, b *brokerProcess) string {
	t.Helper()
	const prefix = "kpar broker schema registry listening on "
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for line := range strings.SplitSeq(b.stdout.String(), "\n") {
			if u, ok := strings.CutPrefix(line, prefix); ok {
				return u
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("no registry line; stdout:\n%s\nstderr:\n%s", b.stdout, b.stderr)
		}
	}
}

const (
	interopOrderProto = `syntax = "proto3";
package shop;
import "shop/money.proto";
message Header { string source = 1; }
message Order {
  enum Kind { KIND_UNSPECIFIED = 0; ONLINE = 1; SHOP = 2; }
  message Line { string sku = 1; int32 qty = 2; repeated string tags = 3; }
  int64 id = 1;
  repeated Line lines = 2;
  Kind kind = 3;
  Money total = 4;
  bytes blob = 5;
  map<string, int32> counts = 6;
}
`
	interopMoneyProto = `syntax = "proto3";
package shop;
message Money { string currency = 1; int64 units = 2; }
`
	interopAvroV1 = `{"type":"record","name":"Order","namespace":"shop","fields":[
 {"name":"id","type":"long"},
 {"name":"note","type":["null","string"]},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID","SHIPPED"]}},
 {"name":"blob","type":"bytes"},
 {"name":"hash","type":{"type":"fixed","name":"Hash","size":4}},
 {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"day","type":{"type":"int","logicalType":"date"}},
 {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
 {"name":"uid","type":{"type":"string","logicalType":"uuid"}},
 {"name":"tags","type":{"type":"array","items":"string"}},
 {"name":"attrs","type":{"type":"map","values":"long"}},
 {"name":"ratio","type":"double"}
]}`
	interopJSONSchema = `{"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},"required":["id"]}`
)

// interopAvroV2 is v1 with a defaulted field, a compatible evolution.
var interopAvroV2 = strings.Replace(interopAvroV1, `{"name":"ratio","type":"double"}`,
	`{"name":"ratio","type":"double"},{"name":"channel","type":"string","default":"web"}`, 1)

// interopAvroKinds says how each Avro field of the Node deserializer's
// value maps to kpar's JSON (docs/http-contract.md's table).
var interopAvroKinds = map[string]string{
	"blob": "bytes", "hash": "bytes", "at": "timestamp-millis", "day": "date", "price": "decimal2",
}

// interopProtoFiles compiles the test's Protobuf files.
func interopProtoFiles(t *testing.T) []protoreflect.FileDescriptor {
	t.Helper()
	comp := protocompile.Compiler{Resolver: &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(map[string]string{
		"shop/order.proto": interopOrderProto, "shop/money.proto": interopMoneyProto,
	})}}
	fds, err := comp.Compile(context.Background(), "shop/order.proto")
	if err != nil {
		t.Fatal(err)
	}
	order := fds[0]
	return []protoreflect.FileDescriptor{order.Imports().Get(0).FileDescriptor, order}
}

type interopCase struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Topic  string `json:"topic"`
	Schema string `json:"schema,omitempty"`
	Type   string `json:"type,omitempty"`
	Value  any    `json:"value"`
}

type interopResult struct {
	Name  string          `json:"name"`
	Topic string          `json:"topic"`
	Bytes []byte          `json:"bytes"`
	Node  json.RawMessage `json:"node"`
}

// TestTypedInteropWithConfluentSerializers serializes records with
// Confluent's own JavaScript serializers (examples/serializers, npm
// @confluentinc/schemaregistry) into kpar broker's registry: Avro (v1,
// then an evolved v2 with a defaulted field), Protobuf (nested and
// repeated messages, an enum, a map, the second message of a file, an
// imported reference) and JSON Schema. kpar forward --schema-registry must
// send the endpoint the JSON docs/http-contract.md's table defines,
// checked field by field against what Confluent's Node deserializer reads
// from the same bytes (and, for Protobuf, against protojson in Go).
func TestTypedInteropWithConfluentSerializers(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing(t, "no node: apt-get install nodejs npm")
	}
	dir := filepath.Join(root, "examples", "serializers")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@confluentinc", "schemaregistry", "package.json")); err != nil {
		missing(t, "@confluentinc/schemaregistry is not installed: run npm ci in examples/serializers")
	}
	bin, ctx := e2e(t, 3*time.Minute)
	broker, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2", "--schema-registry", "127.0.0.1:0")
	regURL := registryURL(ctx, t, broker)

	files := interopProtoFiles(t)
	set := &descriptorpb.FileDescriptorSet{}
	for _, f := range files {
		set.File = append(set.File, protodesc.ToFileDescriptorProto(f))
	}
	setBytes, _ := proto.Marshal(set)
	b64 := func(b ...byte) map[string]string {
		return map[string]string{"$bytes": base64.StdEncoding.EncodeToString(b)}
	}
	avroValue := func(id int, channel string) map[string]any {
		v := map[string]any{
			"id": 9007199254740000 + id, "note": nil, "status": "PAID", "blob": b64(0, 1, 0xfe), "hash": b64(9, 8, 7, byte(id)),
			"at": 1714979289123 + id, "day": 19782, "price": b64(0xcf, 0xc7), "uid": "7d444840-9dc0-11d1-b245-5ffdce74fad2",
			"tags": []string{"a", "naïve"}, "attrs": map[string]int{"x": id}, "ratio": 0.25,
		}
		if id%2 == 0 {
			v["note"] = "gift wrap"
		}
		if channel != "" {
			v["channel"] = channel
		}
		return v
	}
	order := map[string]any{
		"id": "123456789012345678", "kind": "ONLINE", "blob": "AAH+",
		"lines":  []any{map[string]any{"sku": "A-1", "qty": 2, "tags": []string{"red"}}, map[string]any{"sku": "B-2"}},
		"total":  map[string]any{"currency": "EUR", "units": "1250"},
		"counts": map[string]any{"x": 3},
	}
	cases := []interopCase{
		{Name: "avro-v1-a", Kind: "avro", Topic: "typed-avro", Schema: interopAvroV1, Value: avroValue(1, "")},
		{Name: "avro-v1-b", Kind: "avro", Topic: "typed-avro", Value: avroValue(2, "")},
		{Name: "avro-v2-a", Kind: "avro", Topic: "typed-avro", Schema: interopAvroV2, Value: avroValue(3, "store")},
		{Name: "avro-v2-b", Kind: "avro", Topic: "typed-avro", Value: avroValue(4, "web")},
		{Name: "proto-order", Kind: "protobuf", Topic: "typed-proto", Type: "shop.Order", Value: order},
		{Name: "proto-header", Kind: "protobuf", Topic: "typed-proto", Type: "shop.Header", Value: map[string]any{"source": "web"}},
		{Name: "proto-line", Kind: "protobuf", Topic: "typed-proto", Type: "shop.Order.Line", Value: map[string]any{"sku": "N-1", "qty": 7}},
		{Name: "json-a", Kind: "json", Topic: "typed-json", Schema: interopJSONSchema, Value: map[string]any{"id": 1, "name": "Zoë", "tags": []string{"x"}}},
		{Name: "json-b", Kind: "json", Topic: "typed-json", Value: map[string]any{"id": 2}},
	}
	tmp := t.TempDir()
	plan, _ := json.Marshal(map[string]any{"registry": regURL, "fileDescriptorSet": setBytes, "cases": cases})
	planFile, outFile := filepath.Join(tmp, "plan.json"), filepath.Join(tmp, "out.json")
	if err := os.WriteFile(planFile, plan, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, node, "serialize.js", planFile, outFile)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node serialize.js: %v\n%s", err, out)
	}
	var results []interopResult
	raw, err := os.ReadFile(outFile)
	if err == nil {
		err = json.Unmarshal(raw, &results)
	}
	if err != nil || len(results) != len(cases) {
		t.Fatalf("node's results: %v (%d of %d)", err, len(results), len(cases))
	}

	cl := newClient(t, addr, kgo.AllowAutoTopicCreation())
	defer cl.Close()
	for _, r := range results {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: r.Topic, Key: []byte(r.Name), Value: r.Bytes}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	ep := newTypedEndpoint(t)
	fwd := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "interop", "--topic", "typed-avro,typed-proto,typed-json",
		"--url", ep.srv.URL, "--schema-registry", regURL)
	got := ep.await(ctx, t, len(cases), fwd)

	msgs := map[string]protoreflect.MessageDescriptor{}
	for _, f := range files {
		for i := range f.Messages().Len() {
			m := f.Messages().Get(i)
			msgs[string(m.FullName())] = m
			for j := range m.Messages().Len() {
				msgs[string(m.Messages().Get(j).FullName())] = m.Messages().Get(j)
			}
		}
	}
	for i, r := range results {
		c := cases[i]
		req, ok := got[r.Name]
		if !ok {
			t.Errorf("%s: not received", r.Name)
			continue
		}
		if ct := req.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", r.Name, ct)
		}
		if id := req.header.Get("Kpar-Schema-Id"); id != fmt.Sprint(binary.BigEndian.Uint32(r.Bytes[1:5])) {
			t.Errorf("%s: Kpar-Schema-Id %q, want the ID of the bytes %d", r.Name, id, binary.BigEndian.Uint32(r.Bytes[1:5]))
		}
		if f := req.header.Get("Kpar-Value-Form"); f != map[string]string{"avro": "avro", "protobuf": "protobuf", "json": "jsonschema"}[c.Kind] {
			t.Errorf("%s: Kpar-Value-Form %q", r.Name, f)
		}
		ours := jsonOf(t, req.body)
		t.Logf("%s: the endpoint received %s", r.Name, req.body)
		switch c.Kind {
		case "protobuf":
			m := dynamicpb.NewMessage(msgs[c.Type])
			in, _ := json.Marshal(c.Value)
			if err := protojson.Unmarshal(in, m); err != nil {
				t.Fatal(err)
			}
			want, _ := protojson.Marshal(m)
			if !reflect.DeepEqual(ours, jsonOf(t, want)) {
				t.Errorf("%s: endpoint got %s, protojson of the same message is %s", r.Name, req.body, want)
			}
			if strings.Contains(string(r.Node), "$error") {
				t.Logf("%s: the Node deserializer failed (%s); checked against protojson only", r.Name, r.Node)
			} else if !reflect.DeepEqual(ours, jsonOf(t, r.Node)) {
				t.Errorf("%s: endpoint got %s, Node's deserializer (toJson) read %s", r.Name, req.body, r.Node)
			}
		default:
			compareWithNode(t, r.Name, jsonOf(t, r.Node), ours)
		}
		if c.Kind == "avro" {
			v2 := strings.HasPrefix(c.Name, "avro-v2")
			if ch, has := ours.(map[string]any)["channel"]; has != v2 || v2 && ch != c.Value.(map[string]any)["channel"] {
				t.Errorf("%s: channel %v (present %v), want it only in v2 records, as written: %s", r.Name, ch, has, req.body)
			}
		}
	}
	if n := strings.Count(fwd.stderr.String(), "handler failed"); n != 0 {
		t.Errorf("%d failed attempts; kpar forward:\n%s", n, tail(fwd.stderr))
	}
}

func jsonOf(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("not JSON: %q: %v", b, err)
	}
	return v
}

// compareWithNode checks kpar's JSON against the Node deserializer's
// value field by field, through the mapping of interopAvroKinds.
func compareWithNode(t *testing.T, name string, node, ours any) {
	t.Helper()
	nm, ok1 := node.(map[string]any)
	om, ok2 := ours.(map[string]any)
	if !ok1 || !ok2 {
		t.Errorf("%s: node %v, kpar %v: want two objects", name, node, ours)
		return
	}
	if len(nm) != len(om) {
		t.Errorf("%s: node has %d fields, kpar %d: %v vs %v", name, len(nm), len(om), nm, om)
	}
	for k, nv := range nm {
		ov, ok := om[k]
		if !ok {
			t.Errorf("%s.%s: missing from kpar's JSON", name, k)
			continue
		}
		want := nv
		switch interopAvroKinds[k] {
		case "bytes":
			want = nv.(map[string]any)["$bytes"]
		case "timestamp-millis":
			ms, _ := nv.(json.Number).Int64()
			want = time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
		case "date":
			days, _ := nv.(json.Number).Int64()
			want = time.Unix(days*86400, 0).UTC().Format(time.DateOnly)
		case "decimal2":
			raw, _ := base64.StdEncoding.DecodeString(nv.(map[string]any)["$bytes"].(string))
			n := new(big.Int).SetBytes(raw)
			if len(raw) > 0 && raw[0]&0x80 != 0 {
				n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(raw))))
			}
			want = new(big.Rat).SetFrac(n, big.NewInt(100)).FloatString(2)
		}
		if !reflect.DeepEqual(want, ov) {
			t.Errorf("%s.%s: kpar sent %#v, Node's deserializer read %#v (mapped: %#v)", name, k, ov, nv, want)
		}
	}
}

// TestTypedRegistryOutageDeadLettersNothing puts a proxy in front of kpar
// broker's registry that answers 503 while it is "down": records whose
// schema is not cached yet wait (an overload: no attempt burnt), nothing
// is dead-lettered, the log and /readyz name the registry, and everything
// is delivered once it is back.
func TestTypedRegistryOutageDeadLettersNothing(t *testing.T) {
	bin, ctx := e2e(t, 3*time.Minute)
	broker, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2", "--schema-registry", "127.0.0.1:0")
	regURL := registryURL(ctx, t, broker)
	target, _ := url.Parse(regURL)
	var down atomic.Bool
	var refused atomic.Int64
	refusedCh := make(chan struct{}, 1)
	down.Store(true)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			refused.Add(1)
			select {
			case refusedCh <- struct{}{}:
			default:
			}
			http.Error(w, `{"error_code":50301,"message":"down for maintenance"}`, http.StatusServiceUnavailable)
			return
		}
		httputil.NewSingleHostReverseProxy(target).ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)

	reg, err := sr.NewClient(sr.URLs(regURL))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := reg.CreateSchema(ctx, "outage-value", sr.Schema{Schema: `{"type":"record","name":"R","fields":[{"name":"n","type":"long"}]}`})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	cl := newClient(t, addr, kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("outage"))
	defer cl.Close()
	for i := range n {
		v := binary.BigEndian.AppendUint32([]byte{0}, uint32(ss.ID))
		v = binary.AppendVarint(v, int64(i))
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	ep := newTypedEndpoint(t)
	status := freePort(t)
	fwd := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "outage", "--topic", "outage",
		"--url", ep.srv.URL, "--schema-registry", proxy.URL, "--max-attempts", "2",
		"--metrics-listen", "127.0.0.1:"+status, "--ready-stall", "1s")
	// Down until the forwarder has asked a few times (and been refused).
	for refused.Load() < 4 {
		select {
		case <-refusedCh:
		case <-ctx.Done():
			t.Fatalf("the registry was asked %d times: %v\n%s", refused.Load(), ctx.Err(), tail(fwd.stderr))
		}
	}
	readyz := awaitReadyzMentions(ctx, t, "http://127.0.0.1:"+status+"/readyz", proxy.URL)
	down.Store(false)
	got := ep.await(ctx, t, n, fwd)
	for i := range n {
		if b := got[fmt.Sprint(i)].body; string(b) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Errorf("record %d: body %q", i, b)
		}
	}
	if code := fwd.stop(ctx, t, os.Interrupt); code != 0 {
		t.Errorf("kpar forward exited %d", code)
	}
	logs := fwd.stderr.String()
	if strings.Contains(logs, "dead-lettered") {
		t.Errorf("a record was dead-lettered during the outage:\n%s", tail(fwd.stderr))
	}
	named := false
	for line := range strings.SplitSeq(logs, "\n") {
		named = named || strings.Contains(line, "schema registry "+proxy.URL+" answered 503")
	}
	if !named {
		t.Errorf("no log line says the registry %s answered 503:\n%s", proxy.URL, tail(fwd.stderr))
	}
	topics, err := kadm.NewClient(cl).ListTopics(ctx, "outage.dlq")
	if err != nil {
		t.Fatal(err)
	}
	if topics.Has("outage.dlq") {
		for p, end := range endOffsets(ctx, t, addr, "outage.dlq") {
			if end != 0 {
				t.Errorf("outage.dlq partition %d holds %d records, want 0", p, end)
			}
		}
	}
	checkCommittedAtEnd(ctx, t, addr, "outage", "outage")
	t.Logf("registry refused %d requests; /readyz said: %s", refused.Load(), readyz)
}

// awaitReadyzMentions polls /readyz until it answers 503 naming what.
func awaitReadyzMentions(ctx context.Context, t *testing.T, url, what string) string {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), what) {
				return strings.TrimSpace(string(b))
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("/readyz never named %s: %v", what, ctx.Err())
		}
	}
}

// TestTypedRepliesFitTheirSchemaOrDeadLetterTheirInput runs kpar forward
// --reply-topic --reply-schema, at least once and --exactly-once: each
// JSON reply is produced in the wire format of the subject's latest
// schema, and a reply that does not fit dead-letters its input (its
// original bytes) and produces nothing.
func TestTypedRepliesFitTheirSchemaOrDeadLetterTheirInput(t *testing.T) {
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) {
			bin, ctx := e2e(t, 3*time.Minute)
			broker, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2", "--schema-registry", "127.0.0.1:0")
			regURL := registryURL(ctx, t, broker)
			reg, err := sr.NewClient(sr.URLs(regURL))
			if err != nil {
				t.Fatal(err)
			}
			in, err := reg.CreateSchema(ctx, "in-value", sr.Schema{Schema: `{"type":"record","name":"In","fields":[{"name":"n","type":"long"}]}`})
			if err != nil {
				t.Fatal(err)
			}
			out, err := reg.CreateSchema(ctx, "out-value", sr.Schema{Schema: `{"type":"record","name":"Out","fields":[{"name":"n","type":"long"},{"name":"ok","type":"boolean"}]}`})
			if err != nil {
				t.Fatal(err)
			}
			const n, misfit = 6, 3
			cl := newClient(t, addr, kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("in"))
			defer cl.Close()
			inputs := map[int][]byte{}
			for i := range n {
				v := binary.AppendVarint(binary.BigEndian.AppendUint32([]byte{0}, uint32(in.ID)), int64(i))
				inputs[i] = v
				if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: v}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var v struct{ N int }
				body, _ := io.ReadAll(r.Body)
				_ = json.Unmarshal(body, &v)
				w.Header().Set("Content-Type", "application/json")
				if v.N == misfit {
					fmt.Fprint(w, `{"n":"three"}`)
					return
				}
				fmt.Fprintf(w, `{"n":%d,"ok":true}`, v.N)
			}))
			defer srv.Close()
			args := []string{"--brokers", addr, "--group", "replies", "--topic", "in", "--url", srv.URL,
				"--schema-registry", regURL, "--reply-topic", "out", "--reply-schema", "out-value"}
			if eos {
				args = append(args, "--exactly-once", "--instance-id", "typed")
			}
			fwd := startForward(ctx, t, bin, nil, args...)
			letters := readCommitted(ctx, t, addr, "in.dlq", 1)
			replies := readCommitted(ctx, t, addr, "out", n-1)
			if len(letters) != 1 || len(replies) != n-1 {
				t.Fatalf("%d dead letters and %d replies committed, want 1 and %d; kpar forward:\n%s", len(letters), len(replies), n-1, tail(fwd.stderr))
			}
			if code := fwd.stop(ctx, t, os.Interrupt); code != 0 {
				t.Errorf("exit %d", code)
			}
			if l := letters[0]; !bytes.Equal(l.Value, inputs[misfit]) || string(l.Key) != fmt.Sprint(misfit) {
				t.Errorf("dead letter %s=%q, want the input %d's own bytes %q", l.Key, l.Value, misfit, inputs[misfit])
			}
			if msg := headerValue(letters[0], deadletter.HeaderMessage); !strings.Contains(msg, "does not fit") {
				t.Errorf("dead letter's message %q does not say the reply does not fit", msg)
			}
			seen := map[string]bool{}
			for _, r := range replies {
				if len(r.Value) < 5 || r.Value[0] != 0 || int(binary.BigEndian.Uint32(r.Value[1:5])) != out.ID {
					t.Errorf("reply %q is not in the wire format of schema %d", r.Value, out.ID)
					continue
				}
				k, _ := binary.Varint(r.Value[5:])
				if fmt.Sprint(k) != string(r.Key) || r.Value[len(r.Value)-1] != 1 {
					t.Errorf("reply keyed %s: % x", r.Key, r.Value)
				}
				seen[string(r.Key)] = true
			}
			if seen[fmt.Sprint(misfit)] || len(seen) != n-1 {
				t.Errorf("replies for %v, want every input but %d", seen, misfit)
			}
		})
	}
}

// TestTypedFlagsRejectBadUsage: each typed-records flag misused exits 2
// with a line naming it, before anything connects.
func TestTypedFlagsRejectBadUsage(t *testing.T) {
	base := []string{"--brokers", "127.0.0.1:1", "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:1/in"}
	srv := httptest.NewServer(http.NotFoundHandler()) // a registry that knows no subject
	t.Cleanup(srv.Close)
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		flag string
	}{
		{"undecodable", []string{"--schema-registry", srv.URL, "--undecodable", "drop"}, nil, "--undecodable"},
		{"validate without registry", []string{"--schema-validate"}, nil, "--schema-validate"},
		{"registry scheme", []string{"--schema-registry", "ftp://x"}, nil, "--schema-registry"},
		{"reply schema without reply topic", []string{"--schema-registry", srv.URL, "--reply-schema", "out-value"}, nil, "--reply-schema"},
		{"reply schema unknown", []string{"--schema-registry", srv.URL, "--reply-topic", "out", "--reply-schema", "missing-value"}, nil, "--reply-schema"},
		{"reply schema version", []string{"--schema-registry", srv.URL, "--reply-topic", "out", "--reply-schema", "out-value:x"}, nil, "--reply-schema"},
		{"password without user", []string{"--schema-registry", srv.URL}, map[string]string{envRegistryPassword: "secret"}, envRegistryPassword},
		{"empty token file", []string{"--schema-registry", srv.URL, "--schema-registry-token-file", empty}, nil, "--schema-registry-token-file"},
		{"user and token", []string{"--schema-registry", srv.URL, "--schema-registry-user", "u"}, map[string]string{envRegistryToken: "tok"}, "--schema-registry-user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			if code := cmdForward(t.Context(), append(slices.Clone(base), tc.args...), &stdout, &stderr); code != 2 {
				t.Errorf("exit %d, want 2; stderr:\n%s", code, &stderr)
			}
			if !strings.Contains(stderr.String(), tc.flag) || strings.Contains(stderr.String(), "secret") {
				t.Errorf("stderr does not name %s (or shows the secret):\n%s", tc.flag, &stderr)
			}
		})
	}
}

// TestDLQListShowsDecodedValues: kpar dlq list --schema-registry prints
// each letter's value decoded under it, and a value not in the wire
// format as it is.
func TestDLQListShowsDecodedValues(t *testing.T) {
	reg := srfake.New()
	t.Cleanup(reg.Close)
	id, _, err := reg.RegisterSchema("orders-value", sr.Schema{Schema: `{"type":"record","name":"R","fields":[{"name":"n","type":"long"}]}`})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "letters.jsonl")
	var lines []byte
	for i, v := range [][]byte{binary.AppendVarint(binary.BigEndian.AppendUint32([]byte{0}, uint32(id)), 21), []byte("plain")} {
		b, err := deadletter.MarshalJSONLine(deadletter.Letter{
			Record: &kgo.Record{Topic: "orders", Offset: int64(i), Value: v}, Group: "g", Class: deadletter.ClassPermanent, Message: "422", Attempts: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		lines = append(append(lines, b...), '\n')
	}
	if err := os.WriteFile(file, lines, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := cmdDLQ(t.Context(), []string{"list", "--source", "file://" + file, "--schema-registry", reg.URL()}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, &stderr)
	}
	for _, want := range []string{"    value (avro, schema ID 1):\n      {\n        \"n\": 21\n      }", "    value (text):\n      plain"} {
		if !strings.Contains(stdout.String(), want+"\n") {
			t.Errorf("output lacks %q:\n%s", want, &stdout)
		}
	}
}

// TestTypedRecordsOnEveryWayOfConsuming decodes the same Avro topic with
// a consumer group in --batch mode, a share group and kpar backfill: each
// way delivers every record as its JSON, with its form and schema ID.
func TestTypedRecordsOnEveryWayOfConsuming(t *testing.T) {
	bin, ctx := e2e(t, 3*time.Minute)
	broker, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1", "--schema-registry", "127.0.0.1:0")
	regURL := registryURL(ctx, t, broker)
	reg, err := sr.NewClient(sr.URLs(regURL))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := reg.CreateSchema(ctx, "ways-value", sr.Schema{Schema: `{"type":"record","name":"R","fields":[{"name":"n","type":"long"},{"name":"s","type":["null","string"]}]}`})
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	cl := newClient(t, addr, kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("ways"))
	defer cl.Close()
	for i := range n {
		v := binary.AppendVarint(binary.BigEndian.AppendUint32([]byte{0}, uint32(ss.ID)), int64(i))
		v = append(binary.AppendVarint(binary.AppendVarint(v, 1), 1), 'x')
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for _, way := range []struct {
		name    string
		command string
		args    []string
	}{
		{"group --batch", "forward", []string{"--group", "ways", "--topic", "ways", "--batch", "4"}},
		{"share group", "forward", []string{"--share-group", "ways-share", "--topic", "ways"}}, // not the consumer group's name
		{"backfill", "backfill", []string{"--topic", "ways", "--from", "0", "--to", fmt.Sprint(n)}},
		{"filter on a decoded field", "forward", []string{"--group", "ways-filter", "--topic", "ways", "--filter", "value.n % 2 == 0"}},
	} {
		t.Run(way.name, func(t *testing.T) {
			ep := newTypedEndpoint(t)
			args := append([]string{"--brokers", addr, "--url", ep.srv.URL, "--schema-registry", regURL}, way.args...)
			p := startCommand(ctx, t, bin, way.command, nil, io.Discard, args...)
			step, want := 1, n
			if strings.Contains(way.name, "filter") {
				step, want = 2, n/2 // the odd ones are filtered
			}
			got := ep.await(ctx, t, want, p)
			if len(got) != want {
				t.Errorf("%d records reached the endpoint, want %d", len(got), want)
			}
			for i := 0; i < n; i += step {
				r := got[fmt.Sprint(i)]
				if string(r.body) != fmt.Sprintf(`{"n":%d,"s":"x"}`, i) || r.header.Get("Kpar-Value-Form") != "avro" ||
					r.header.Get("Kpar-Schema-Id") != fmt.Sprint(ss.ID) || r.header.Get("Content-Type") != "application/json" {
					t.Errorf("record %d: %s %v", i, r.body, r.header)
				}
			}
			if way.command == "forward" {
				if code := p.stop(ctx, t, os.Interrupt); code != 0 {
					t.Errorf("exit %d:\n%s", code, tail(p.stderr))
				}
				if step == 2 { // filtered records are committed too
					checkCommittedAtEnd(ctx, t, addr, "ways-filter", "ways")
				}
			} else if code := p.wait(ctx, t); code != 0 {
				t.Errorf("exit %d:\n%s", code, tail(p.stderr))
			}
		})
	}
}

// TestTypedCheckConfigAsksNoRegistry: --check-config with
// --schema-registry and --reply-schema prints them and asks nothing of a
// registry that is not there.
func TestTypedCheckConfigAsksNoRegistry(t *testing.T) {
	withoutKparEnv(t)
	var stdout, stderr bytes.Buffer
	code := cmdForward(t.Context(), []string{"--brokers", "127.0.0.1:1", "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:1/",
		"--schema-registry", "http://127.0.0.1:1", "--reply-topic", "out", "--reply-schema", "out-value:2", "--check-config"}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "schema_registry: http://127.0.0.1:1") || !strings.Contains(stdout.String(), "the schema registry") {
		t.Errorf("exit %d; stdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
}
