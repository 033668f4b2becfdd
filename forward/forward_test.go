package forward

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// captured is what a test server saw of one request.
type captured struct {
	method string
	header http.Header
	body   []byte
}

// recorder serves status for every request and keeps what it received.
func recorder(t *testing.T, status int) (*httptest.Server, <-chan captured) {
	t.Helper()
	ch := make(chan captured, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ch <- captured{r.Method, r.Header.Clone(), body}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv, ch
}

func newHandler(t *testing.T, url string, opts ...Opt) *Handler {
	t.Helper()
	h, err := New(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.CloseIdleConnections)
	return h
}

func TestForwardRequestCarriesTheRecord(t *testing.T) {
	srv, got := recorder(t, http.StatusNoContent)
	h := newHandler(t, srv.URL)
	ts := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.FixedZone("CEST", 2*3600))
	r := &kgo.Record{
		Topic:     "orders",
		Partition: 7,
		Offset:    12345,
		Timestamp: ts,
		Key:       []byte{0, 1, 0xfe, 0xff},
		Value:     []byte("hello\x00world"),
		Headers: []kgo.RecordHeader{
			{Key: "trace-id", Value: []byte("abc")},
			{Key: "trace-id", Value: []byte("def")},
			{Key: "with space%é", Value: []byte{0xff}},
			{Key: "empty", Value: nil},
			{Key: "Trace-ID", Value: []byte("ghi")},
			{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
			{Key: "tracestate", Value: []byte("congo=t61rcWkgMzE")},
		},
	}
	if err := h.Handle(context.Background(), r); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	c := <-got
	if c.method != http.MethodPost {
		t.Errorf("method %s, want POST", c.method)
	}
	if string(c.body) != "hello\x00world" {
		t.Errorf("body %q, want the value", c.body)
	}
	want := map[string][]string{
		"Kpar-Topic":                        {"orders"},
		"Kpar-Partition":                    {"7"},
		"Kpar-Offset":                       {"12345"},
		"Kpar-Timestamp":                    {"2024-05-06T05:08:09.123Z"},
		"Kpar-Key":                          {base64.StdEncoding.EncodeToString(r.Key)},
		"Kpar-Header-Trace-Id":              {"YWJj", "ZGVm", "Z2hp"}, // merged: why Kpar-Headers exists
		"Kpar-Header-With%20space%25%C3%A9": {"/w=="},
		"Kpar-Header-Empty":                 {""},
		"Kpar-Headers": {"trace-id=YWJj, trace-id=ZGVm, with%20space%25%C3%A9=/w==, empty=, Trace-ID=Z2hp, " +
			"traceparent=MDAtNGJmOTJmMzU3N2IzNGRhNmEzY2U5MjlkMGUwZTQ3MzYtMDBmMDY3YWEwYmE5MDJiNy0wMQ==, " +
			"tracestate=Y29uZ289dDYxcmNXa2dNekU="},
		"Traceparent":    {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		"Tracestate":     {"congo=t61rcWkgMzE"},
		"Content-Type":   {"application/octet-stream"},
		"Content-Length": {"11"},
		"Kpar-Tombstone": nil,
	}
	for k, v := range want {
		g := c.header.Values(k)
		if k == "Kpar-Header-Trace-Id" { // merged from two names: no order
			g = slices.Sorted(slices.Values(g))
			v = slices.Sorted(slices.Values(v))
		}
		if !slices.Equal(g, v) {
			t.Errorf("header %s = %q, want %q", k, g, v)
		}
	}
}

// TestForwardKparHeadersDecodeToTheRecordHeaders decodes Kpar-Headers as a
// receiver would and gets the record's headers back, names with their case
// and bytes, in order, which Kpar-Header-<h> cannot promise.
func TestForwardKparHeadersDecodeToTheRecordHeaders(t *testing.T) {
	srv, got := recorder(t, http.StatusOK)
	h := newHandler(t, srv.URL)
	want := []kgo.RecordHeader{
		{Key: "ID", Value: []byte("upper")}, {Key: "id", Value: []byte("lower")},
		{Key: "a=b, c", Value: []byte{0, 1, 2}}, {Key: "\xff%", Value: []byte{}}, {Key: "ID", Value: []byte("again")},
	}
	if err := h.Handle(context.Background(), &kgo.Record{Topic: "t", Value: []byte("v"), Headers: want}); err != nil {
		t.Fatal(err)
	}
	c := <-got
	var back []kgo.RecordHeader
	for item := range strings.SplitSeq(c.header.Get(HeaderHeaders), ", ") {
		name, b64, ok := strings.Cut(item, "=")
		if !ok {
			t.Fatalf("item %q has no '='", item)
		}
		k, err := url.PathUnescape(name)
		if err != nil {
			t.Fatal(err)
		}
		v, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatal(err)
		}
		back = append(back, kgo.RecordHeader{Key: k, Value: v})
	}
	if len(back) != len(want) {
		t.Fatalf("decoded %q, want %q", back, want)
	}
	for i := range want {
		if back[i].Key != want[i].Key || string(back[i].Value) != string(want[i].Value) {
			t.Errorf("header %d = %q, want %q", i, back[i], want[i])
		}
	}
	if v := c.header.Values("Kpar-Header-Id"); len(v) != 3 {
		t.Errorf("Kpar-Header-Id = %q, want the three ID/id values merged (the compatible form)", v)
	}
}

// TestForwardNilAndEmptyDiffer: a nil value (a tombstone) and an empty one
// reach the endpoint distinguishably (Kpar-Tombstone), and so do a nil key
// (no Kpar-Key) and an empty one (an empty Kpar-Key).
func TestForwardNilAndEmptyDiffer(t *testing.T) {
	srv, got := recorder(t, http.StatusOK)
	h := newHandler(t, srv.URL)
	for _, tc := range []struct {
		name       string
		key, value []byte
		tombstone  []string
		keyHeader  []string // nil: no Kpar-Key header
	}{
		{"nil value", []byte("k"), nil, []string{"true"}, []string{"aw=="}},
		{"empty value", []byte("k"), []byte{}, nil, []string{"aw=="}},
		{"nil key", nil, []byte{}, nil, nil},
		{"empty key", []byte{}, []byte{}, nil, []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.Handle(context.Background(), &kgo.Record{Topic: "t", Key: tc.key, Value: tc.value}); err != nil {
				t.Fatal(err)
			}
			c := <-got
			if g := c.header.Values(HeaderTombstone); !slices.Equal(g, tc.tombstone) {
				t.Errorf("Kpar-Tombstone = %q, want %q", g, tc.tombstone)
			}
			if g := c.header[HeaderKey]; !slices.Equal(g, tc.keyHeader) {
				t.Errorf("Kpar-Key = %q, want %q", g, tc.keyHeader)
			}
			if len(c.body) != 0 {
				t.Errorf("body %q, want empty", c.body)
			}
		})
	}
}

func TestForwardExtraHeadersAreSent(t *testing.T) {
	srv, got := recorder(t, http.StatusOK)
	h := newHandler(t, srv.URL, Header(http.Header{"authorization": {"Bearer x"}}), Header(http.Header{"X-Env": {"a", "b"}}))
	if err := h.Handle(context.Background(), &kgo.Record{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	c := <-got
	if g := c.header.Get("Authorization"); g != "Bearer x" {
		t.Errorf("Authorization = %q", g)
	}
	if g := c.header.Values("X-Env"); !slices.Equal(g, []string{"a", "b"}) {
		t.Errorf("X-Env = %q", g)
	}
}

func TestForwardTLSConfigTrustsAPrivateCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	if err := newHandler(t, srv.URL).Handle(context.Background(), &kgo.Record{Topic: "t"}); err == nil {
		t.Errorf("the system roots trusted the test server's certificate")
	}
	h := newHandler(t, srv.URL, TLSConfig(&tls.Config{RootCAs: pool}))
	if err := h.Handle(context.Background(), &kgo.Record{Topic: "t"}); err != nil {
		t.Errorf("with the CA: %v", err)
	}
}

func TestForwardResponseClassification(t *testing.T) {
	type outcome int
	const (
		done outcome = iota
		retry
		permanent
	)
	for _, tc := range []struct {
		status int
		want   outcome
	}{
		{200, done}, {201, done}, {202, done}, {204, done}, {299, done},
		{400, permanent}, {401, permanent}, {403, permanent}, {404, permanent},
		{409, permanent}, {413, permanent}, {422, permanent}, {499, permanent},
		{408, retry}, {429, retry},
		{500, retry}, {502, retry}, {503, retry}, {504, retry}, {599, retry},
		{301, permanent}, {302, permanent}, {303, permanent}, {304, permanent},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.status >= 300 && tc.status < 400 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, "  the reason\n")
			}))
			defer srv.Close()
			h := newHandler(t, srv.URL)
			err := h.Handle(context.Background(), &kgo.Record{Topic: "t", Value: []byte("v")})
			var got outcome
			switch {
			case err == nil:
				got = done
			case kpar.IsPermanent(err):
				got = permanent
			default:
				got = retry
			}
			if got != tc.want {
				t.Fatalf("status %d: outcome %d (err %v), want %d", tc.status, got, err, tc.want)
			}
			if err == nil {
				return
			}
			var se *StatusError
			if !errors.As(err, &se) {
				t.Fatalf("error %v carries no *StatusError", err)
			}
			wantBody := "the reason"
			if tc.status == http.StatusNotModified {
				wantBody = "" // a 304 has no body
			}
			if se.StatusCode != tc.status || se.Body != wantBody {
				t.Errorf("StatusError %+v, want code %d and body %q", se, tc.status, wantBody)
			}
		})
	}
}

func TestForwardRetryAfterIsHonouredOn429And503(t *testing.T) {
	date := time.Now().Add(45 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string
		min, max   time.Duration // expected StatusError.RetryAfter bounds; 0,0 = none
	}{
		{"429 seconds", 429, "7", 7 * time.Second, 7 * time.Second},
		{"503 seconds", 503, " 2 ", 2 * time.Second, 2 * time.Second},
		{"503 date", 503, date, 40 * time.Second, 45 * time.Second},
		{"429 date in the past", 429, "Mon, 02 Jan 2006 15:04:05 GMT", 0, 0},
		{"429 capped", 429, "86400", time.Minute, time.Minute},
		{"429 garbage", 429, "soon", 0, 0},
		{"500 ignores it", 500, "7", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", tc.retryAfter)
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()
			h := newHandler(t, srv.URL, MaxRetryAfter(time.Minute))
			err := h.Handle(context.Background(), &kgo.Record{Topic: "t"})
			var se *StatusError
			if !errors.As(err, &se) || kpar.IsPermanent(err) {
				t.Fatalf("err %v: want a retryable *StatusError", err)
			}
			if se.RetryAfter < tc.min || se.RetryAfter > tc.max {
				t.Errorf("RetryAfter %v, want %v to %v", se.RetryAfter, tc.min, tc.max)
			}
		})
	}
}

func TestForwardParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true},
		{"120", 2 * time.Minute, true},
		{"99999999999999999999", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"", 0, false},
		{"Thu, 02 Jan 2025 03:05:05 GMT", time.Minute, true},
		{"Thursday, 02-Jan-25 03:04:15 GMT", 10 * time.Second, true},
		{"Thu Jan  2 03:04:06 2025", time.Second, true},
		{"Wed, 01 Jan 2025 00:00:00 GMT", 0, true},
	} {
		got, ok := parseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	if d, ok := parseRetryAfter("9223372036854775807", now); !ok || d <= 0 {
		t.Errorf("a huge delay-seconds gave %v, %v; want a positive saturated duration", d, ok)
	}
}

func TestForwardTimeoutIsRetryable(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	h := newHandler(t, srv.URL, Timeout(50*time.Millisecond))
	start := time.Now()
	err := h.Handle(context.Background(), &kgo.Record{Topic: "t"})
	if err == nil || kpar.IsPermanent(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v: want a retryable deadline error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Handle took %v with a 50ms timeout", d)
	}
}

func TestForwardContextEndsTheRequest(t *testing.T) {
	arrived := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
	}))
	defer srv.Close()
	h := newHandler(t, srv.URL, Timeout(0))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }()
	err := h.Handle(ctx, &kgo.Record{Topic: "t"})
	if !errors.Is(err, context.Canceled) || kpar.IsPermanent(err) {
		t.Fatalf("err %v: want a retryable context.Canceled", err)
	}
}

func TestForwardConnectionRefusedIsRetryable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	h := newHandler(t, "http://"+addr+"/in")
	err = h.Handle(context.Background(), &kgo.Record{Topic: "t"})
	if err == nil || kpar.IsPermanent(err) {
		t.Fatalf("err %v: want a retryable connection error", err)
	}
}

func TestForwardRedirectKeepingTheMethodIsFollowedWithTheBody(t *testing.T) {
	mux := http.NewServeMux()
	var got atomic.Value
	mux.HandleFunc("/old", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/new", http.StatusPermanentRedirect)
	})
	mux.HandleFunc("/new", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(r.Method + " " + string(b) + " " + r.Header.Get(HeaderTopic))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	h := newHandler(t, srv.URL+"/old")
	if err := h.Handle(context.Background(), &kgo.Record{Topic: "t", Value: []byte("body")}); err != nil {
		t.Fatal(err)
	}
	if g, _ := got.Load().(string); g != "POST body t" {
		t.Errorf("redirect target saw %q, want %q", g, "POST body t")
	}
}

// A redirect to another host keeps the record but not the Header values,
// which are often credentials for the first host.
func TestForwardRedirectToAnotherHostDropsExtraHeaders(t *testing.T) {
	got := make(chan http.Header, 1)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	defer other.Close()
	first := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/in", http.StatusTemporaryRedirect)
	}))
	defer first.Close()
	h := newHandler(t, first.URL, Header(http.Header{"Authorization": {"Bearer x"}}))
	if err := h.Handle(context.Background(), &kgo.Record{Topic: "t", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	hd := <-got
	if hd.Get("Authorization") != "" || hd.Get(HeaderTopic) != "t" {
		t.Errorf("other host saw Authorization %q, Kpar-Topic %q: want none and t", hd.Get("Authorization"), hd.Get(HeaderTopic))
	}
}

// TestForwardPoolKeepsConnectionsAlive checks that Concurrency workers share
// Concurrency keep-alive connections: no connection per request, and never
// more connections than the pool allows, even with more callers.
func TestForwardPoolKeepsConnectionsAlive(t *testing.T) {
	const pool, callers, perCaller = 4, 8, 25
	var opened, open, maxOpen atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A body the client must drain before it can reuse the connection.
		w.Write(make([]byte, 4096))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			opened.Add(1)
			n := open.Add(1)
			for m := maxOpen.Load(); n > m && !maxOpen.CompareAndSwap(m, n); m = maxOpen.Load() {
			}
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	defer srv.Close()
	h := newHandler(t, srv.URL, Concurrency(pool))
	var wg sync.WaitGroup
	errs := make(chan error, callers*perCaller)
	for range callers {
		wg.Go(func() {
			for i := range perCaller {
				errs <- h.Handle(context.Background(), &kgo.Record{Topic: "t", Offset: int64(i), Value: []byte("x")})
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := opened.Load(); n > pool {
		t.Errorf("%d connections opened for %d requests, want at most %d (the pool)", n, callers*perCaller, pool)
	}
	if n := maxOpen.Load(); n > pool {
		t.Errorf("%d connections open at once, want at most %d", n, pool)
	}
}

func TestForwardNewRejectsBadArguments(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  string
		opts []Opt
	}{
		{"no scheme", "example.com/in", nil},
		{"ftp", "ftp://example.com/in", nil},
		{"no host", "http:///in", nil},
		{"unparsable", "http://[::1", nil},
		{"zero concurrency", "http://example.com", []Opt{Concurrency(0)}},
		{"negative timeout", "http://example.com", []Opt{Timeout(-time.Second)}},
		{"negative max retry-after", "http://example.com", []Opt{MaxRetryAfter(-time.Second)}},
		{"zero batch", "http://example.com", []Opt{Batch(0, time.Millisecond)}},
		{"batch without wait", "http://example.com", []Opt{Batch(10, 0)}},
		{"kpar header", "http://example.com", []Opt{Header(http.Header{"Kpar-Topic": {"x"}})}},
		{"content type not a media type", "http://example.com", []Opt{Header(http.Header{"content-type": {"json"}})}},
		{"content type twice", "http://example.com", []Opt{Header(http.Header{"content-type": {"a/b", "c/d"}})}},
		{"content types disagree", "http://example.com", []Opt{ContentType("a/b"), Header(http.Header{"Content-Type": {"c/d"}})}},
		{"content type option", "http://example.com", []Opt{ContentType("application/json\r\nX: 1")}},
		{"ce header with cloudevents", "http://example.com", []Opt{CloudEvents("", ""), Header(http.Header{"Ce-Type": {"x"}})}},
		{"cloudevents with batch", "http://example.com", []Opt{CloudEvents("", ""), Batch(10, time.Millisecond)}},
		{"traceparent", "http://example.com", []Opt{Header(http.Header{"Traceparent": {"x"}})}},
		{"bad name", "http://example.com", []Opt{Header(http.Header{"a b": {"x"}})}},
		{"line break", "http://example.com", []Opt{Header(http.Header{"X-A": {"x\r\nEvil: 1"}})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.url, tc.opts...); err == nil {
				t.Errorf("New(%q) succeeded, want an error", tc.url)
			}
		})
	}
}

func TestForwardErrorRedactsThePassword(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
	}))
	defer srv.Close()
	h := newHandler(t, "http://user:s3cret@"+srv.Listener.Addr().String()+"/in")
	err := h.Handle(context.Background(), &kgo.Record{Topic: "t"})
	if err == nil || !kpar.IsPermanent(err) {
		t.Fatalf("err %v, want permanent", err)
	}
	if s := err.Error(); strings.Contains(s, "s3cret") {
		t.Errorf("error %q shows the password", s)
	}
}

func TestForwardHeaderName(t *testing.T) {
	for in, want := range map[string]string{
		"":           "",
		"trace-id":   "trace-id",
		"a b":        "a%20b",
		"100%":       "100%25",
		"x:y":        "x%3Ay",
		"é":          "%C3%A9",
		"tab\there":  "tab%09here",
		"!#$&'*+.^_": "!#$&'*+.^_",
	} {
		if got := headerName(in); got != want {
			t.Errorf("headerName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestForwardContentTypeRule: a record's own content-type header (any
// case, the last one) is the request's Content-Type; a record without one
// gets ContentType, or application/octet-stream without it.
func TestForwardContentTypeRule(t *testing.T) {
	ct := func(k, v string) []kgo.RecordHeader { return []kgo.RecordHeader{{Key: k, Value: []byte(v)}} }
	for _, tc := range []struct {
		name    string
		opts    []Opt
		headers []kgo.RecordHeader
		want    string
	}{
		{"default", nil, nil, "application/octet-stream"},
		{"option", []Opt{ContentType("application/json")}, nil, "application/json"},
		{"Header alias", []Opt{Header(http.Header{"content-type": {"application/json"}})}, nil, "application/json"},
		{"alias agreeing with the option", []Opt{ContentType("application/json"), Header(http.Header{"Content-Type": {"Application/JSON"}})}, nil, "Application/JSON"},
		{"record header wins", []Opt{ContentType("application/json")}, ct("content-type", "text/plain; charset=utf-8"), "text/plain; charset=utf-8"},
		{"record header in any case", nil, ct("Content-Type", "application/avro"), "application/avro"},
		{"last record header", nil, append(ct("content-type", "a/b"), ct("CONTENT-TYPE", "c/d")...), "c/d"},
		{"broken record header", []Opt{ContentType("application/json")}, ct("content-type", "a/b\r\nX-Evil: 1"), "application/json"},
		{"empty record header", []Opt{ContentType("application/json")}, ct("content-type", " "), "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, got := recorder(t, http.StatusOK)
			h := newHandler(t, srv.URL, tc.opts...)
			if err := h.Handle(t.Context(), &kgo.Record{Topic: "t", Value: []byte("{}"), Headers: tc.headers}); err != nil {
				t.Fatal(err)
			}
			c := <-got
			if g := c.header.Values("Content-Type"); len(g) != 1 || g[0] != tc.want {
				t.Errorf("Content-Type %q, want %q", g, tc.want)
			}
			if len(tc.headers) > 0 && c.header.Get(HeaderHeaders) == "" {
				t.Errorf("the content-type record header is missing from Kpar-Headers")
			}
		})
	}
}

// The body of a failed response reaches the error (and so the dead
// letter) as one bounded line of printable text.
func TestForwardErrorQuotesTheResponseAsPrintableText(t *testing.T) {
	long := strings.Repeat("x", 2000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, "<h1>Bad\tRequest</h1>\r\n\n  sku \x00\x1b[31m\"A-1\" unknown\xff "+long)
	}))
	defer srv.Close()
	err := newHandler(t, srv.URL).Handle(t.Context(), &kgo.Record{Topic: "t"})
	var se *StatusError
	if !errors.As(err, &se) || !kpar.IsPermanent(err) {
		t.Fatalf("err %v, want a permanent *StatusError", err)
	}
	want := "<h1>Bad Request</h1> sku [31m\"A-1\" unknown\uFFFD x"
	if !strings.HasPrefix(se.Body, want) || len(se.Body) > snippetLimit+8 {
		t.Errorf("Body %q (%d bytes), want it to start %q and hold about %d bytes", se.Body, len(se.Body), want, snippetLimit)
	}
	if !strings.HasSuffix(err.Error(), se.Body) {
		t.Errorf("error %q does not end with the body", err)
	}
}
