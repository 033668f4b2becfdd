package route

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// benchValue is a ~200-byte JSON order.
const benchValue = `{"id":"9f1c2b7e-5d43-4a7b-8f0e-2c6d1e9a3b57","type":"order","customer":{"id":48213,"tier":"gold","country":"NL"},` +
	`"amount":129.95,"currency":"EUR","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"created":"2026-03-01T12:00:00Z"}`

func benchRecord() *kgo.Record {
	return &kgo.Record{
		Topic: "orders", Partition: 3, Offset: 42, Timestamp: time.Unix(1700000000, 0),
		Key:     []byte("customer-48213"),
		Value:   []byte(benchValue),
		Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/json")}, {Key: "type", Value: []byte("order")}},
	}
}

var noop = kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return nil })

// BenchmarkFilterOneField is the cost of a one-field CEL filter per
// record. "eval" is the evaluation alone, on a value already decoded (a
// map); the others are the whole Handle of a record whose filter reads the
// field: the topic, a header, or a field of the JSON value, which Handle
// parses first.
func BenchmarkFilterOneField(b *testing.B) {
	b.Run("eval/value.type", func(b *testing.B) {
		h, err := New(nil, noop, Filter(`value.type == "order"`))
		if err != nil {
			b.Fatal(err)
		}
		a := &activation{h: h, ctx: context.Background(), r: benchRecord()}
		a.value = parseJSON([]byte(benchValue), "value")
		b.ReportAllocs()
		for b.Loop() {
			if ok, err := h.filter.eval(a); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
	for _, tc := range []struct{ name, expr string }{
		{"handle/topic", `topic == "orders"`},
		{"handle/header", `headers["type"] == "order"`},
		{"handle/json-value.type", `value.type == "order"`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h, err := New(nil, noop, Filter(tc.expr))
			if err != nil {
				b.Fatal(err)
			}
			r, ctx := benchRecord(), context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := h.Handle(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			if st := h.Stats(); st.Filtered != 0 || st.Errors() != 0 {
				b.Fatalf("%+v", st)
			}
		})
	}
}

// BenchmarkParseJSON measures parseJSON on the ~200-byte order.
func BenchmarkParseJSON(b *testing.B) {
	v := []byte(benchValue)
	b.ReportAllocs()
	b.SetBytes(int64(len(v)))
	for b.Loop() {
		if _, ok := parseJSON(v, "value").(map[string]any); !ok {
			b.Fatal("not an object")
		}
	}
}
