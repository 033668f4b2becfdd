package forward

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// quietLog keeps a test server's expected TLS handshake errors out of the
// test output.
func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// deadlineCtx is a context whose deadline the test passes by hand
// (close(done)), as kpar's AttemptTimeout does.
type deadlineCtx struct {
	context.Context
	done chan struct{}
}

func newDeadlineCtx() deadlineCtx { return deadlineCtx{context.Background(), make(chan struct{})} }

func (c deadlineCtx) Done() <-chan struct{} { return c.done }

func (c deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// hangingEndpoint never answers the requests whose Kpar-Offset is in hang
// (or any batch, when hangBatches) and tells arrived about each of them;
// it answers the others 200.
func hangingEndpoint(t *testing.T, hang map[string]bool, hangBatches bool) (url string, arrived <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hang[r.Header.Get(HeaderOffset)] || hangBatches && r.Header.Get(HeaderOffset) == "" {
			// Read to the end first: only then does the server watch the
			// connection, and end r.Context() when the client gives up.
			io.Copy(io.Discard, r.Body)
			ch <- struct{}{}
			<-r.Context().Done()
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, ch
}

// An endpoint that hangs for everyone is an outage: the timeout burns no
// attempt (Overloaded), and kpar backs off instead of dead-lettering.
func TestForwardTimeoutOfAHangingEndpointIsOverloaded(t *testing.T) {
	url, arrived := hangingEndpoint(t, map[string]bool{"1": true}, false)
	h := newHandler(t, url, Timeout(0))
	ctx := newDeadlineCtx()
	go func() { <-arrived; close(ctx.done) }()
	err := h.Handle(ctx, &kgo.Record{Topic: "t", Offset: 1})
	if !kpar.IsOverloaded(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want an Overloaded deadline error", err)
	}
}

// A record that hangs the endpoint while it answers others is the
// record's failure: the attempt counts.
func TestForwardTimeoutOfOneHangingRecordCounts(t *testing.T) {
	url, arrived := hangingEndpoint(t, map[string]bool{"1": true}, false)
	h := newHandler(t, url, Timeout(0))
	ctx := newDeadlineCtx()
	go func() {
		<-arrived
		if err := h.Handle(t.Context(), &kgo.Record{Topic: "t", Offset: 2}); err != nil {
			t.Errorf("the other record: %v", err)
		}
		close(ctx.done)
	}()
	err := h.Handle(ctx, &kgo.Record{Topic: "t", Offset: 1})
	if err == nil || kpar.IsOverloaded(err) || kpar.IsPermanent(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want a plain retryable deadline error", err)
	}
}

// A batch whose members all reached their deadline timed out too.
func TestForwardBatchTimeoutIsOverloaded(t *testing.T) {
	url, arrived := hangingEndpoint(t, nil, true)
	h := newHandler(t, url, Timeout(0), Batch(2, time.Hour))
	ctx1, ctx2 := newDeadlineCtx(), newDeadlineCtx()
	go func() { <-arrived; close(ctx1.done); close(ctx2.done) }()
	errs := make(chan error, 2)
	go func() { errs <- h.Handle(ctx1, &kgo.Record{Topic: "t"}) }()
	go func() { errs <- h.Handle(ctx2, &kgo.Record{Topic: "t"}) }()
	for range 2 {
		if err := <-errs; !kpar.IsOverloaded(err) {
			t.Errorf("err %v, want Overloaded", err)
		}
	}
}

// kpar stopping an attempt (a cancelled context) is not an overload.
func TestForwardCancelledAttemptIsNotOverloaded(t *testing.T) {
	url, arrived := hangingEndpoint(t, map[string]bool{"1": true}, false)
	h := newHandler(t, url, Timeout(0))
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-arrived; cancel() }()
	if err := h.Handle(ctx, &kgo.Record{Topic: "t", Offset: 1}); err == nil || kpar.IsOverloaded(err) {
		t.Errorf("err %v, want a plain error", err)
	}
}

// A certificate that does not verify is a configuration error: said so,
// with the host and the x509 reason, marked Misconfigured (held, not the
// record's fault), never Permanent.
func TestForwardCertificateErrorIsAConfigurationError(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.Config.ErrorLog = quietLog()
	srv.StartTLS()
	defer srv.Close()
	h := newHandler(t, srv.URL)
	err := h.Handle(t.Context(), &kgo.Record{Topic: "t"})
	var te *TLSError
	if !errors.As(err, &te) || !kpar.IsMisconfigured(err) || kpar.IsPermanent(err) {
		t.Fatalf("err %v, want a *TLSError marked Misconfigured, not Permanent", err)
	}
	host := srv.Listener.Addr().String()
	for _, s := range []string{host, "x509: certificate signed by unknown authority", "configuration error", "--url-ca"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

func TestForwardCheckTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("CheckTLS sent a request: %s %s", r.Method, r.URL)
	}))
	srv.Config.ErrorLog = quietLog()
	srv.StartTLS()
	defer srv.Close()
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer plain.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())

	var te *TLSError
	if err := newHandler(t, srv.URL).CheckTLS(t.Context()); !errors.As(err, &te) || te.Host != srv.Listener.Addr().String() {
		t.Errorf("untrusted certificate: %v, want a *TLSError naming the host", err)
	}
	if err := newHandler(t, srv.URL, TLSConfig(&tls.Config{RootCAs: pool})).CheckTLS(t.Context()); err != nil {
		t.Errorf("trusted certificate: %v", err)
	}
	if err := newHandler(t, plain.URL).CheckTLS(t.Context()); err != nil {
		t.Errorf("http URL: %v, want nil (nothing to check)", err)
	}
	notTLS := "https://" + plain.Listener.Addr().String()
	if err := newHandler(t, notTLS).CheckTLS(t.Context()); !errors.As(err, &te) || !strings.Contains(err.Error(), "does not speak TLS") {
		t.Errorf("https to a plain server: %v, want a *TLSError saying it does not speak TLS", err)
	}
	if err := newHandler(t, "https://"+closed).CheckTLS(t.Context()); err == nil || errors.As(err, &te) {
		t.Errorf("nothing listening: %v, want an error that is not a *TLSError", err)
	}
}

// A redirect loop is an answer, not an outage: the attempt counts.
func TestForwardRedirectLoopIsNotOverloaded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	err := newHandler(t, srv.URL+"/loop").Handle(t.Context(), &kgo.Record{Topic: "t", Value: []byte("v")})
	if err == nil || kpar.IsOverloaded(err) || kpar.IsPermanent(err) || !strings.Contains(err.Error(), "stopped after 10 redirects") {
		t.Errorf("err %v, want a plain error naming the redirects", err)
	}
}
