package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/protocol"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/forward"
)

// TestSDKReceiverAcceptsEveryRequest sends records of every kind through
// forward.Handler with CloudEvents to the CloudEvents Go SDK's receiver:
// every request must be taken (Handle returns nil only for a 2xx, and
// the SDK answers 400 to an event it cannot read), with the attributes
// the package documentation promises.
func TestSDKReceiverAcceptsEveryRequest(t *testing.T) {
	var (
		mu  sync.Mutex
		got = map[string]cloudevents.Event{}
	)
	h, err := receiver(t.Context(), func(e cloudevents.Event) protocol.Result {
		mu.Lock()
		defer mu.Unlock()
		got[e.ID()] = e
		return cloudevents.ResultACK
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	ts := time.Date(2025, 3, 4, 5, 6, 7, 891000000, time.UTC)
	hdr := func(kv ...string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	type want struct {
		id, source, typ, subject, contentType, data string
		time                                        time.Time
		ext                                         map[string]string
	}
	for _, tc := range []struct {
		name string
		opts []forward.Opt // besides forward.CloudEvents
		rec  *kgo.Record
		want want
	}{
		{"a JSON record", []forward.Opt{forward.ContentType("application/json")},
			&kgo.Record{Topic: "orders", Partition: 2, Offset: 40, Timestamp: ts, Key: []byte("customer-7"), Value: []byte(`{"total":9.5}`)},
			want{id: "orders/2/40", source: "kafka://orders", typ: "dev.kpar.record", subject: "customer-7",
				contentType: "application/json", data: `{"total":9.5}`, time: ts}},
		{"bytes, a binary key, source and type given", []forward.Opt{forward.CloudEvents("https://shop.example/{topic}", "com.example.blob")}, // the later option wins
			&kgo.Record{Topic: "blobs", Offset: 1, Timestamp: ts, Key: []byte{0xff, 0}, Value: []byte{0, 1, 2, 0xff}},
			want{id: "blobs/0/1", source: "https://shop.example/blobs", typ: "com.example.blob",
				contentType: "application/octet-stream", data: "\x00\x01\x02\xff", time: ts}},
		{"a tombstone, no key", nil,
			&kgo.Record{Topic: "orders", Offset: 41, Timestamp: ts},
			want{id: "orders/0/41", source: "kafka://orders", typ: "dev.kpar.record", contentType: "application/octet-stream", time: ts}},
		{"a key with a space", nil,
			&kgo.Record{Topic: "orders", Offset: 42, Timestamp: ts, Key: []byte("customer 7"), Value: []byte("x")},
			// The HTTP binding percent-encodes; this SDK does not decode.
			want{id: "orders/0/42", source: "kafka://orders", typ: "dev.kpar.record", subject: "customer%207",
				contentType: "application/octet-stream", data: "x", time: ts}},
		{"a record with a content-type header and an extension", []forward.Opt{forward.ContentType("application/json")},
			&kgo.Record{Topic: "orders", Offset: 43, Timestamp: ts, Value: []byte("a,b"),
				Headers: hdr("content-type", "text/csv", "ce_tenant", "acme", "ce_type", "com.example.csv")},
			want{id: "orders/0/43", source: "kafka://orders", typ: "com.example.csv", contentType: "text/csv", data: "a,b",
				time: ts, ext: map[string]string{"tenant": "acme"}}},
		{"a record that is a CloudEvent (Kafka binding)", nil,
			&kgo.Record{Topic: "events", Offset: 7, Timestamp: ts, Key: []byte("k"), Value: []byte(`{"a":1}`),
				Headers: hdr("ce_specversion", "1.0", "ce_id", "evt-123", "ce_source", "/producer/a", "ce_type", "com.example.made",
					"ce_time", "2020-01-02T03:04:05Z", "ce_subject", "s-1", "ce_partitionkey", "k", "content-type", "application/json")},
			want{id: "evt-123", source: "/producer/a", typ: "com.example.made", subject: "s-1", contentType: "application/json",
				data: `{"a":1}`, time: time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC), ext: map[string]string{"partitionkey": "k"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fh, err := forward.New(srv.URL, append([]forward.Opt{forward.CloudEvents("", "")}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer fh.CloseIdleConnections()
			if err := fh.Handle(t.Context(), tc.rec); err != nil {
				t.Fatalf("the SDK receiver refused the request: %v", err)
			}
			mu.Lock()
			e, ok := got[tc.want.id]
			mu.Unlock()
			if !ok {
				t.Fatalf("no event with id %q", tc.want.id)
			}
			w := tc.want
			if e.SpecVersion() != "1.0" || e.Source() != w.source || e.Type() != w.typ || e.Subject() != w.subject ||
				e.DataContentType() != w.contentType || string(e.Data()) != w.data || !e.Time().Equal(w.time) {
				t.Errorf("event %s", e)
			}
			for k, v := range w.ext {
				if g, _ := e.Extensions()[k].(string); g != v {
					t.Errorf("extension %s = %v, want %q", k, e.Extensions()[k], v)
				}
			}
		})
	}

	// The control: the same receiver refuses an event without an id, so
	// the 2xx answers above are its approval.
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Ce-Specversion", "1.0")
	req.Header.Set("Ce-Source", "/s")
	req.Header.Set("Ce-Type", "t")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		t.Errorf("an event without ce-id got %s, want a refusal", resp.Status)
	}
}
