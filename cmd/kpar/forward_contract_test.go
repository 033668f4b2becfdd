package main

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The HTTP contract as the CLI keeps it (docs/http-contract.md): the
// Content-Type rule and CloudEvents on the wire, timeouts and certificates
// in the status table.

// TestForwardSendsContentTypeAndCloudEvents runs two forwarders on one
// topic: one given the content type as --header 'Content-Type: ...' (the
// alias of --content-type), one with --cloudevents; then kpar backfill
// with --content-type over the same records.
func TestForwardSendsContentTypeAndCloudEvents(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1")
	cl := newClient(t, addr, kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("events"))
	hdr := func(kv ...string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	err := cl.ProduceSync(ctx,
		&kgo.Record{Key: []byte("customer-1"), Value: []byte(`{"a":1}`)},
		&kgo.Record{Value: []byte("a,b"), Headers: hdr("Content-Type", "text/csv")},
		&kgo.Record{Value: []byte(`{}`), Headers: hdr("ce_specversion", "1.0", "ce_id", "evt-9", "ce_source", "/shop", "ce_type", "com.example.made")},
	).FirstErr()
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}

	type request struct {
		path   string
		header http.Header
	}
	var ep struct {
		changes
		got []request // guarded by mu
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		ep.note(func() { ep.got = append(ep.got, request{r.URL.Path, r.Header.Clone()}) })
	}))
	defer srv.Close()
	plain := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "plain", "--topic", "events",
		"--url", srv.URL+"/plain", "--header", "Content-Type: application/json")
	ce := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "ce", "--topic", "events",
		"--url", srv.URL+"/ce", "--cloudevents", "--ce-type", "com.example.order", "--content-type", "application/json")
	if !ep.await(ctx, nil, func() bool { return len(ep.got) == 6 }) {
		t.Fatalf("the endpoint got %d requests of 6; stderr:\n%s\n%s", len(ep.got), tail(plain.stderr), tail(ce.stderr))
	}
	for _, p := range []*process{plain, ce} {
		if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
			t.Errorf("exit code %d, want 0; stderr:\n%s", code, tail(p.stderr))
		}
	}
	// kpar backfill takes the same request flags.
	bf := startBackfill(ctx, t, bin, io.Discard, "--brokers", addr, "--topic", "events", "--from", "0", "--to", "3",
		"--url", srv.URL+"/backfill", "--content-type", "application/json")
	if code := bf.wait(ctx, t); code != 0 {
		t.Fatalf("kpar backfill exited %d, want 0; stderr:\n%s", code, tail(bf.stderr))
	}
	if !ep.await(ctx, nil, func() bool { return len(ep.got) == 9 }) {
		t.Fatalf("the endpoint got %d requests of 9", len(ep.got))
	}
	want := map[string][]map[string]string{ // path -> per offset: header -> value ("" absent)
		"/plain": {
			{"Content-Type": "application/json", "Ce-Id": ""},
			{"Content-Type": "text/csv"},
			{"Content-Type": "application/json", "Ce-Id": ""},
		},
		"/backfill": {
			{"Content-Type": "application/json", "Ce-Id": ""},
			{"Content-Type": "text/csv"},
			{"Content-Type": "application/json", "Ce-Id": ""},
		},
		"/ce": {
			{"Content-Type": "application/json", "Ce-Specversion": "1.0", "Ce-Id": "events/0/0", "Ce-Source": "kafka://events",
				"Ce-Type": "com.example.order", "Ce-Subject": "customer-1"},
			{"Content-Type": "text/csv", "Ce-Id": "events/0/1", "Ce-Subject": ""},
			{"Content-Type": "application/json", "Ce-Id": "evt-9", "Ce-Source": "/shop", "Ce-Type": "com.example.made", "Ce-Time": ""},
		},
	}
	for _, r := range ep.got {
		off := r.header.Get("Kpar-Offset")
		i := int(off[0] - '0')
		for k, v := range want[r.path][i] {
			if g := r.header.Get(k); g != v {
				t.Errorf("%s offset %s: %s = %q, want %q", r.path, off, k, g, v)
			}
		}
		if r.path == "/ce" && r.header.Get("Ce-Time") == "" && i != 2 {
			t.Errorf("/ce offset %s: no Ce-Time", off)
		}
	}
}

// TestForwardRefusesAnEndpointCertificateAtStart: an https --url whose
// certificate does not verify (or that does not speak TLS) would fail
// every request alike; kpar forward says so and exits 2 before it
// consumes anything.
func TestForwardRefusesAnEndpointCertificateAtStart(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a request reached the endpoint: %s %s", r.Method, r.URL)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer plain.Close()
	host := srv.Listener.Addr().String()
	for _, tc := range []struct {
		url  string
		want []string
	}{
		{srv.URL, []string{"invalid --url", host, "x509: certificate signed by unknown authority", "configuration error", "--url-ca"}},
		{"https://" + plain.Listener.Addr().String(), []string{"invalid --url", "does not speak TLS", "http://"}},
	} {
		var stderr bytes.Buffer
		// Nothing listens on port 1: the brokers are never reached.
		code := cmdForward(t.Context(), []string{"--brokers", "127.0.0.1:1", "--group", "g", "--topic", "t", "--url", tc.url}, io.Discard, &stderr)
		if code != 2 {
			t.Errorf("%s: exit code %d, want 2; stderr:\n%s", tc.url, code, stderr.String())
		}
		for _, s := range tc.want {
			if !strings.Contains(stderr.String(), s) {
				t.Errorf("%s: stderr does not say %q:\n%s", tc.url, s, stderr.String())
			}
		}
	}
}
