package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/schema"
)

// ---- decode ----

// The decode scenario forwards ~200-byte Avro and Protobuf records
// (Confluent wire format) to a no-op endpoint twice per round: decoded to
// JSON through an in-process registry (forward.Decode with the schema
// module), and as raw bytes, as without a registry. The ratio is decoded
// over raw records/s; the note gives CPU per record (the process's, the
// broker included).

const decodeAvroSchema = `{"type":"record","name":"Order","namespace":"bench","fields":[
 {"name":"id","type":"long"},
 {"name":"customer","type":"string"},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID","SHIPPED"]}},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
 {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"note","type":["null","string"]},
 {"name":"tags","type":{"type":"array","items":"string"}},
 {"name":"sku","type":"string"},
 {"name":"address","type":"string"}
]}`

const decodeProtoSchema = `syntax = "proto3";
package bench;
message Order {
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  int64 id = 1;
  string customer = 2;
  Status status = 3;
  int64 amount_cents = 4;
  int64 at_millis = 5;
  string note = 6;
  repeated string tags = 7;
  string sku = 8;
  string address = 9;
}
`

const decodeFiller = "12 Rue de la Paix, 75002 Paris, France; leave the parcel at the door, ring twice, or with the neighbour at number 14"

// avroOrder appends record i's Avro value, in the wire format of id.
func avroOrder(b []byte, id int, i int64) []byte {
	str := func(b []byte, s string) []byte { return append(binary.AppendVarint(b, int64(len(s))), s...) }
	b = binary.BigEndian.AppendUint32(append(b, 0), uint32(id))
	b = binary.AppendVarint(b, i)
	b = str(b, "customer-"+strconv.FormatInt(i%1000, 10))
	b = binary.AppendVarint(b, 1)
	b = append(binary.AppendVarint(b, 3), 0x01, 0x86, 0xa0) // 1000.00
	b = binary.AppendVarint(b, 1714979289123+i)
	b = str(binary.AppendVarint(b, 1), "gift wrap, please")
	b = str(str(binary.AppendVarint(b, 2), "red"), "express")
	b = append(b, 0)
	b = str(b, "SKU-"+strconv.FormatInt(i%97, 10))
	return str(b, decodeFiller)
}

// protoOrder appends record i's Protobuf value, in the wire format of id
// (message index [0]).
func protoOrder(b []byte, id int, i int64) []byte {
	tag := func(b []byte, f, wt int) []byte { return binary.AppendUvarint(b, uint64(f<<3|wt)) }
	str := func(b []byte, f int, s string) []byte {
		return append(binary.AppendUvarint(tag(b, f, 2), uint64(len(s))), s...)
	}
	b = append(binary.BigEndian.AppendUint32(append(b, 0), uint32(id)), 0)
	b = binary.AppendUvarint(tag(b, 1, 0), uint64(i))
	b = str(b, 2, "customer-"+strconv.FormatInt(i%1000, 10))
	b = binary.AppendUvarint(tag(b, 3, 0), 1)
	b = binary.AppendUvarint(tag(b, 4, 0), 100000)
	b = binary.AppendUvarint(tag(b, 5, 0), uint64(1714979289123+i))
	b = str(b, 6, "gift wrap, please")
	b = str(str(b, 7, "red"), 7, "express")
	b = str(b, 8, "SKU-"+strconv.FormatInt(i%97, 10))
	return str(b, 9, decodeFiller)
}

func (r *runner) decode(ctx context.Context) ([]Result, error) {
	reg := srfake.New()
	defer reg.Close()
	avroID, _, err := reg.RegisterSchema("bench-avro-value", sr.Schema{Schema: decodeAvroSchema})
	if err != nil {
		return nil, err
	}
	protoID, _, err := reg.RegisterSchema("bench-proto-value", sr.Schema{Schema: decodeProtoSchema, Type: sr.TypeProtobuf})
	if err != nil {
		return nil, err
	}
	client, err := schema.New(reg.URL())
	if err != nil {
		return nil, err
	}
	ep, err := newEndpoint(0, 0, false)
	if err != nil {
		return nil, err
	}
	defer ep.close()
	const conc = 256
	var out []Result
	for _, f := range []struct {
		name string
		gen  func(b []byte, i int64) []byte
	}{
		{"avro", func(b []byte, i int64) []byte { return avroOrder(b, avroID, i) }},
		{"protobuf", func(b []byte, i int64) []byte { return protoOrder(b, protoID, i) }},
	} {
		name := "decode-" + f.name
		t, ok := r.topics[name]
		if !ok {
			if t, err = r.b.createTopic(ctx, name, r.cfg.Partitions, flowKeys, 0); err != nil {
				return out, err
			}
			t.gen = func(i int64, buf []byte) []byte { return f.gen(buf, i) }
			t.valueBytes = len(f.gen(nil, 0))
			start := time.Now()
			if err := r.b.load(ctx, t, r.records(30_000)); err != nil {
				return out, err
			}
			if err := r.b.warm(ctx, t); err != nil {
				return out, err
			}
			r.progressf("loaded %s: %s records of ~%d bytes in %s", name, commas(t.total), t.valueBytes, time.Since(start).Round(time.Millisecond))
			r.topics[name] = t
		}
		dec := schema.NewDecoder(client, schema.DeadLetter)
		var raws, decs []Result
		var dead int64
		for range r.cfg.Rounds {
			raw, _, d1 := r.runForward(ctx, Decode, f.name+", raw bytes", t, ep.url, conc, nil)
			typed, _, d2 := r.runForward(ctx, Decode, f.name+", decoded to JSON", t, ep.url, conc, []forward.Opt{forward.Decode(dec)})
			raws, decs, dead = append(raws, raw), append(decs, typed), dead+d1+d2
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
		}
		raw, typed := median(raws), median(decs)
		if raw.RecordsPerSec > 0 {
			typed.Ratio, typed.RatioTo = typed.RecordsPerSec/raw.RecordsPerSec, "raw bytes"
		}
		perRecord := func(res Result) string {
			if res.Records == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f µs CPU/record", res.Cores*res.Seconds/float64(res.Records)*1e6)
		}
		raw.Note = join(raw.Note, fmt.Sprintf("%d-byte values, concurrency %d, no-op endpoint; %s", t.valueBytes, conc, perRecord(raw)))
		typed.Note = join(typed.Note, fmt.Sprintf("%s (broker included); dead letters %s", perRecord(typed), commas(dead)))
		out = append(out, raw, typed)
	}
	return out, ctx.Err()
}
