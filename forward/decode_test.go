package forward

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// fakeDecoder decodes every value to {"v": "<value>"}, and the key when
// it is "k", counting its calls; fail, when set, is its error.
type fakeDecoder struct {
	calls atomic.Int32
	fail  error
}

func (d *fakeDecoder) Decode(_ context.Context, r *kgo.Record) (Decoded, error) {
	d.calls.Add(1)
	if d.fail != nil {
		return Decoded{}, d.fail
	}
	if string(r.Value) == "raw" {
		return Decoded{Value: r.Value, ValueForm: FormRaw}, nil
	}
	out := Decoded{Value: []byte(`{"v":"` + string(r.Value) + `"}`), ValueForm: FormAvro, ValueSchemaID: 7}
	if string(r.Key) == "k" {
		out.Key, out.KeyForm, out.KeySchemaID = []byte(`"key"`), FormAvro, 3
	}
	return out, nil
}

func TestForwardDecodedValueIsTheBodyAsJSON(t *testing.T) {
	srv, got := recorder(t, http.StatusNoContent)
	h := newHandler(t, srv.URL, Decode(&fakeDecoder{}))
	r := &kgo.Record{Topic: "t", Key: []byte("k"), Value: []byte("x"), Timestamp: time.Unix(0, 0)}
	if err := h.Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	c := <-got
	if string(c.body) != `{"v":"x"}` {
		t.Errorf("body = %q, want the decoded JSON", c.body)
	}
	for k, want := range map[string]string{
		"Content-Type":    "application/json",
		HeaderSchemaID:    "7",
		HeaderValueForm:   "avro",
		HeaderKey:         base64.StdEncoding.EncodeToString([]byte("k")),
		HeaderKeyJSON:     base64.StdEncoding.EncodeToString([]byte(`"key"`)),
		HeaderKeyForm:     "avro",
		HeaderKeySchemaID: "3",
	} {
		if v := c.header.Get(k); v != want {
			t.Errorf("%s = %q, want %q", k, v, want)
		}
	}
}

func TestForwardRawFormIsSentAsItIs(t *testing.T) {
	srv, got := recorder(t, http.StatusNoContent)
	h := newHandler(t, srv.URL, Decode(&fakeDecoder{}))
	if err := h.Handle(context.Background(), &kgo.Record{Topic: "t", Value: []byte("raw")}); err != nil {
		t.Fatal(err)
	}
	c := <-got
	if string(c.body) != "raw" || c.header.Get("Content-Type") != DefaultContentType || c.header.Get(HeaderValueForm) != "raw" || c.header.Get(HeaderSchemaID) != "" {
		t.Errorf("got body %q, headers %v; want the raw value as without a Decoder", c.body, c.header)
	}
}

func TestForwardDecodedFormInTheContextIsNotDecodedAgain(t *testing.T) {
	srv, got := recorder(t, http.StatusNoContent)
	d := &fakeDecoder{}
	h := newHandler(t, srv.URL, Decode(d))
	r := &kgo.Record{Topic: "t", Value: []byte("x")}
	ctx := WithDecoded(context.Background(), r, Decoded{Value: []byte(`{"pre":1}`), ValueForm: FormProtobuf, ValueSchemaID: 9})
	if err := h.Handle(ctx, r); err != nil {
		t.Fatal(err)
	}
	if c := <-got; string(c.body) != `{"pre":1}` || c.header.Get(HeaderSchemaID) != "9" {
		t.Errorf("got %q schema %q, want the context's decoded form", c.body, c.header.Get(HeaderSchemaID))
	}
	if n := d.calls.Load(); n != 0 {
		t.Errorf("decoder called %d times, want 0", n)
	}
}

func TestForwardDecodeErrorIsTheRecordsOutcomeWithoutARequest(t *testing.T) {
	srv, got := recorder(t, http.StatusNoContent)
	for _, b := range []int{1, 4} {
		want := kpar.Permanent(errors.New("schema not found"))
		h := newHandler(t, srv.URL, Decode(&fakeDecoder{fail: want}), Batch(b, time.Millisecond))
		if err := h.Handle(context.Background(), &kgo.Record{Topic: "t", Value: []byte("x")}); !errors.Is(err, want) {
			t.Errorf("batch %d: err = %v, want the decoder's", b, err)
		}
	}
	select {
	case c := <-got:
		t.Errorf("a request was sent: %q", c.body)
	default:
	}
}

func TestForwardBatchItemCarriesDecodedJSONAndItsForm(t *testing.T) {
	bodies := make(chan []byte, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		bodies <- body
	}))
	t.Cleanup(srv.Close)
	h := newHandler(t, srv.URL, Decode(&fakeDecoder{}), Batch(2, time.Minute))
	errs := handleAll(h, []*kgo.Record{{Topic: "t", Key: []byte("k"), Value: []byte("x")}, {Topic: "t", Value: []byte("raw")}})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var items []map[string]any
	if body := <-bodies; json.Unmarshal(body, &items) != nil || len(items) != 2 {
		t.Fatalf("got %d items", len(items))
	}
	byForm := map[any]map[string]any{items[0]["value_form"]: items[0], items[1]["value_form"]: items[1]}
	a, raw := byForm["avro"], byForm["raw"]
	if v, _ := a["value"].(map[string]any); v["v"] != "x" || a["value_schema_id"] != 7.0 || a["key_json"] != "key" || a["key_form"] != "avro" || a["content_type"] != "application/json" {
		t.Errorf("decoded item = %v", a)
	}
	if raw["value"] != base64.StdEncoding.EncodeToString([]byte("raw")) {
		t.Errorf("raw item = %v, want its value in base64", raw)
	}
}

type upperEncoder struct{}

func (upperEncoder) EncodeReply(_ context.Context, _ *kgo.Record, v []byte) ([]byte, error) {
	if string(v) == "bad" {
		return nil, kpar.Permanent(errors.New("does not fit"))
	}
	return append([]byte{0}, v...), nil
}

func TestForwardReplyGoesThroughTheReplyEncoder(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	h := newHandler(t, srv.URL, Replies("out"), EncodeReplies(upperEncoder{}))
	err := h.Handle(context.Background(), &kgo.Record{Topic: "t", Value: []byte("bad")})
	if !kpar.IsPermanent(err) || !strings.Contains(err.Error(), "does not fit") {
		t.Errorf("a reply the encoder refuses: err = %v, want permanent", err)
	}
}
