package forward

import (
	"net/http"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The SDK-side check (a CloudEvents SDK receiver takes every request) is
// examples/cloudevents; these pin the headers themselves.
func TestForwardCloudEventsHeaders(t *testing.T) {
	ts := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.FixedZone("CEST", 2*3600))
	hdr := func(kv ...string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	for _, tc := range []struct {
		name string
		opts []Opt
		rec  kgo.Record
		want map[string]string // "" means absent
	}{
		{"a plain record", nil,
			kgo.Record{Topic: "orders", Partition: 3, Offset: 42, Timestamp: ts, Key: []byte("customer 7"), Value: []byte(`{}`)},
			map[string]string{
				"Ce-Specversion": "1.0", "Ce-Id": "orders/3/42", "Ce-Source": "kafka://orders", "Ce-Type": "dev.kpar.record",
				"Ce-Time": "2024-05-06T05:08:09.123Z", "Ce-Subject": "customer%207",
				"Content-Type": "application/octet-stream", "Kpar-Offset": "42",
			}},
		{"source and type given", []Opt{CloudEvents("https://shop.example/{topic}/events", "com.example.order"), ContentType("application/json")},
			kgo.Record{Topic: "orders", Timestamp: ts, Key: []byte{0xff, 0xfe}},
			map[string]string{
				"Ce-Source": "https://shop.example/orders/events", "Ce-Type": "com.example.order",
				"Ce-Subject": "", "Content-Type": "application/json",
			}},
		{"no key", nil,
			kgo.Record{Topic: "t", Timestamp: ts},
			map[string]string{"Ce-Subject": "", "Ce-Id": "t/0/0"}},
		{"a record with some ce_ headers", nil,
			kgo.Record{Topic: "t", Offset: 5, Timestamp: ts, Key: []byte("k"),
				Headers: hdr("ce_type", "com.example.x", "ce_Subject", "given", "ce_traceid", "abc", "ce_bad_name", "x", "content-type", "application/cloudevents+json")},
			map[string]string{
				"Ce-Type": "com.example.x", "Ce-Subject": "given", "Ce-Traceid": "abc", "Ce-Bad_name": "",
				"Ce-Id": "t/0/5", "Ce-Specversion": "1.0", "Ce-Time": "2024-05-06T05:08:09.123Z",
				"Content-Type": "application/cloudevents+json",
			}},
		{"a record that is a CloudEvent", nil,
			kgo.Record{Topic: "t", Offset: 5, Timestamp: ts, Key: []byte("k"),
				Headers: hdr("ce_specversion", "1.0", "ce_id", "evt-1", "ce_source", "/producer", "ce_type", "com.example.y",
					"ce_datacontenttype", "x/y", "content-type", "application/json")},
			map[string]string{
				"Ce-Specversion": "1.0", "Ce-Id": "evt-1", "Ce-Source": "/producer", "Ce-Type": "com.example.y",
				"Ce-Time": "", "Ce-Subject": "", "Ce-Datacontenttype": "", "Content-Type": "application/json",
			}},
		{"a CloudEvent without the required attributes", nil,
			kgo.Record{Topic: "t", Partition: 1, Offset: 2, Timestamp: ts, Key: []byte("k"),
				Headers: hdr("ce_specversion", "1.0", "ce_source", "a b\"%é")},
			map[string]string{
				"Ce-Id": "t/1/2", "Ce-Source": "a%20b%22%25%C3%A9", "Ce-Type": "dev.kpar.record", "Ce-Subject": "",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, got := recorder(t, http.StatusOK)
			opts := tc.opts
			if len(opts) == 0 || opts[0] == nil {
				opts = append([]Opt{CloudEvents("", "")}, opts...)
			}
			h := newHandler(t, srv.URL, opts...)
			if err := h.Handle(t.Context(), &tc.rec); err != nil {
				t.Fatal(err)
			}
			c := <-got
			for k, v := range tc.want {
				g := c.header.Values(k)
				switch {
				case v == "" && len(g) > 0:
					t.Errorf("%s = %q, want none", k, g)
				case v != "" && (len(g) != 1 || g[0] != v):
					t.Errorf("%s = %q, want %q", k, g, v)
				}
			}
		})
	}
}
