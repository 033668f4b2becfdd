package forward

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// TestForwardBatchAnswerOfObjects: the answer people write, objects with
// a status, a reason and a wait, mixed with plain statuses; the reason
// reaches each record's error, and so its dead letter.
func TestForwardBatchAnswerOfObjects(t *testing.T) {
	srv := batchServer(t, func(w http.ResponseWriter, b []BatchRecord) {
		items := make([]string, len(b))
		for i, r := range b {
			items[i] = []string{
				`{"status": 200}`,
				`{"status": 422, "error": "no such sku: A-1"}`,
				`{"status": 503, "error": "warehouse busy", "retry_after": 2.5}`,
				`204`,
				`{"status": 500, "error": {"code": "E42"}, "retry_after": 1e9, "extra": true}`,
				`{"status": 201, "error": null}`,
			}[r.Offset]
		}
		io.WriteString(w, "["+strings.Join(items, ",")+"]")
	})
	h := newHandler(t, srv.URL, Batch(6, time.Hour), MaxRetryAfter(time.Minute))
	var rs []*kgo.Record
	for i := range 6 {
		rs = append(rs, &kgo.Record{Topic: "t", Offset: int64(i)})
	}
	errs := handleAll(h, rs)
	for _, i := range []int{0, 3, 5} {
		if errs[i] != nil {
			t.Errorf("record %d: %v, want done", i, errs[i])
		}
	}
	var se *StatusError
	if !kpar.IsPermanent(errs[1]) || !errors.As(errs[1], &se) || se.Reason != "no such sku: A-1" ||
		!strings.HasSuffix(errs[1].Error(), "422 Unprocessable Entity (in a batch of 6): no such sku: A-1") {
		t.Errorf("record 1: %v, want a permanent 422 with its reason last", errs[1])
	}
	if !kpar.IsOverloaded(errs[2]) || !errors.As(errs[2], &se) || se.RetryAfter != 2500*time.Millisecond || se.Reason != "warehouse busy" {
		t.Errorf("record 2: %v, want an overloaded 503 retried after 2.5s with its reason", errs[2])
	}
	if errs[4] == nil || kpar.IsPermanent(errs[4]) || kpar.IsOverloaded(errs[4]) || !errors.As(errs[4], &se) ||
		se.RetryAfter != time.Minute || se.Reason != `{"code": "E42"}` {
		t.Errorf("record 4: %v, want a retryable 500 with the JSON reason and the capped wait", errs[4])
	}
}

// Any other 2xx answer is an error for the whole batch that names the
// shape kpar wants and quotes what it got.
func TestForwardBatchAnswerOfAnotherShapeNamesTheShape(t *testing.T) {
	for _, tc := range []struct{ name, body, why string }{
		{"text", "OK", "not a JSON array"},
		{"an object", `{"ok": true}`, "not a JSON array"},
		{"too short", `[200, 200]`, "2 items for 3 records"},
		{"strings", `["SUCCESS", "SUCCESS", "RETRY"]`, `item 0 (from 0) is "SUCCESS"`},
		{"no status", `[{"ok": 1}, 200, 200]`, `item 0 (from 0) has no "status"`},
		{"status as text", `[200, {"status": "200"}, 200]`, "item 1 (from 0) is an object whose fields do not fit"},
		{"status 999", `[200, 999, 200]`, "item 1 (from 0) has status 999, not a final HTTP status (200 to 599)"},
		{"status -5 in an object", `[200, 200, {"status": -5, "error": "oops"}]`, "item 2 (from 0) has status -5, not a final HTTP status"},
		{"status 100", `[100, 200, 200]`, "item 0 (from 0) has status 100, not a final HTTP status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := batchServer(t, func(w http.ResponseWriter, b []BatchRecord) { io.WriteString(w, tc.body) })
			h := newHandler(t, srv.URL, Batch(3, time.Hour))
			for i, err := range handleAll(h, []*kgo.Record{{Topic: "t"}, {Topic: "t"}, {Topic: "t"}}) {
				msg := ""
				if err != nil {
					msg = err.Error()
				}
				if err == nil || kpar.IsPermanent(err) || !strings.Contains(msg, tc.why) ||
					!strings.Contains(msg, `{"status": 422, "error": "why", "retry_after": seconds, "reply": any JSON}`) || !strings.Contains(msg, "got: ") {
					t.Errorf("record %d: %v; want a retryable error saying %q, naming the shape and quoting the answer", i, err, tc.why)
				}
			}
		})
	}
}

// The content type of each record travels in its element of the batch.
func TestForwardBatchCarriesContentTypes(t *testing.T) {
	got := make(chan []BatchRecord, 1)
	srv := batchServer(t, func(w http.ResponseWriter, b []BatchRecord) { got <- b })
	h := newHandler(t, srv.URL, Batch(2, time.Hour), ContentType("application/json"))
	handleAll(h, []*kgo.Record{
		{Topic: "t", Offset: 0},
		{Topic: "t", Offset: 1, Headers: []kgo.RecordHeader{{Key: "Content-Type", Value: []byte("text/csv")}}},
	})
	for _, r := range <-got {
		if want := []string{"application/json", "text/csv"}[r.Offset]; r.ContentType != want {
			t.Errorf("record %d: content_type %q, want %q", r.Offset, r.ContentType, want)
		}
	}
}
