package schema

import (
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

func BenchmarkDecodeAvro(b *testing.B) {
	s := avro.MustParse(orderAvro)
	payload, err := jsonToAvro(s, []byte(`{"id":1152921504606846977,"note":"gift","status":"NEW","blob":"AAEC","hash":"CQgHBg==","at":"2024-05-06T07:08:09.123Z","atMicros":"2024-05-06T07:08:09.123456Z","day":"2024-02-29","price":"-123.45","uid":"7d444840-9dc0-11d1-b245-5ffdce74fad2","tags":["a","b"],"attrs":{"x":1},"ratio":0.5}`))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := avroToJSON(s, payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeProtobuf(b *testing.B) {
	c, err := compile(1, sr.Schema{Schema: protoFile, Type: sr.TypeProtobuf}, []reference{{"shop/money.proto", sr.Schema{Schema: moneyFile, Type: sr.TypeProtobuf}}})
	if err != nil {
		b.Fatal(err)
	}
	md, _ := c.message([]int{1})
	m := dynamicpb.NewMessage(md)
	if err := protojson.Unmarshal([]byte(`{"id":"42","lines":[{"sku":"a","qty":2},{"sku":"b","qty":1}],"kind":"ONLINE","total":{"currency":"EUR","units":"12"}}`), m); err != nil {
		b.Fatal(err)
	}
	payload, _ := proto.Marshal(m)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.decode(payload, []int{1}, false); err != nil {
			b.Fatal(err)
		}
	}
}
