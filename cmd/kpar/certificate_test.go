package main

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/testkit"
)

// rotatingEndpoint is an https endpoint whose certificate can be swapped
// while it runs, as a certificate rotation does.
type rotatingEndpoint struct {
	*endpoint
	cert atomic.Pointer[tls.Config]
}

func newRotatingEndpoint(t *testing.T, first *tls.Config) *rotatingEndpoint {
	t.Helper()
	return newRotatingEndpointOn(t, nil, first)
}

// newRotatingEndpointOn is newRotatingEndpoint serving ln (nil: a free
// port).
func newRotatingEndpointOn(t *testing.T, ln net.Listener, first *tls.Config) *rotatingEndpoint {
	t.Helper()
	e := &rotatingEndpoint{endpoint: &endpoint{
		behave:   func(int, int) reply { return reply{} },
		attempts: make(map[int][]time.Time),
		ok:       make(map[int]int),
	}}
	e.cert.Store(first)
	e.srv = httptest.NewUnstartedServer(e.endpoint)
	if ln != nil {
		e.srv.Listener.Close()
		e.srv.Listener = ln
	}
	e.srv.Config.ErrorLog = quietLog()
	e.srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return e.cert.Load(), nil }}
	e.srv.StartTLS()
	t.Cleanup(e.srv.Close)
	return e
}

// rotate serves conf from now on, and drops open connections so that the
// forwarder's next requests meet it.
func (e *rotatingEndpoint) rotate(conf *tls.Config) {
	e.cert.Store(conf)
	e.srv.CloseClientConnections()
}

// answers counts the 2xx answers. Lock held.
func (e *rotatingEndpoint) answers() int {
	n := 0
	for _, c := range e.ok {
		n += c
	}
	return n
}

// readyz is GET /readyz: its status code and body.
func readyz(ctx context.Context, addr string) (int, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	return resp.StatusCode, b.String()
}

// TestForwardHoldsRecordsWhileTheCertificateDoesNotVerify: an https
// endpoint whose certificate is rotated mid-run to one signed by another
// CA holds the records that arrive (issue 35: 79-100% were dead-lettered,
// with a WARN line per attempt, and /readyz said ready): nothing is
// dead-lettered, the log says so at ERROR naming the endpoint and the x509
// error, /readyz answers 503 saying why, and once the certificate verifies
// again every record is delivered, the log says it is over and /readyz is
// ready again.
func TestForwardHoldsRecordsWhileTheCertificateDoesNotVerify(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "3")
	trusted, caPEM := selfSigned(t)
	other, _ := selfSigned(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	ep := newRotatingEndpoint(t, trusted)
	dlq := filepath.Join(t.TempDir(), "dead.jsonl")
	const first, n = 30, 130
	produceIndexed(ctx, t, "orders", first, 6, kgo.SeedBrokers(addr))
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "g", "--topic", "orders",
		"--url", ep.srv.URL, "--url-ca", caFile, "--dead-letters", "file://"+dlq, "--max-attempts", "1",
		"--metrics-listen", "127.0.0.1:0")
	ep.waitFor(ctx, t, p, "the first records delivered", func() bool { return ep.delivered() == first })
	status := statusAddr(t, p)

	ep.rotate(other)
	produceIndexed(ctx, t, "orders", n-first, 6, kgo.SeedBrokers(addr))
	holdsWhileRefused(ctx, t, p, status, dlq)

	ep.rotate(trusted)
	deliversOnceFixed(ctx, t, p, ep, status, dlq, n)
}

// TestForwardHoldsRecordsWhenTheEndpointComesUpWithABadCertificate: an
// https endpoint that is down when kpar forward starts (a warning, not an
// exit), then comes up with a certificate that does not verify, holds the
// records as a rotation mid-run does (issue 35: 100% were dead-lettered).
func TestForwardHoldsRecordsWhenTheEndpointComesUpWithABadCertificate(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "3")
	trusted, caPEM := selfSigned(t)
	other, _ := selfSigned(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	endpoint := testkit.ClosedPort(t)
	dlq := filepath.Join(t.TempDir(), "dead.jsonl")
	const n = 60
	produceIndexed(ctx, t, "orders", n, 6, kgo.SeedBrokers(addr))
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "g", "--topic", "orders",
		"--url", "https://"+endpoint, "--url-ca", caFile, "--dead-letters", "file://"+dlq, "--max-attempts", "1",
		"--metrics-listen", "127.0.0.1:0")
	if !p.stderr.wait(ctx, "does not answer yet", p.exited) {
		t.Fatalf("no warning that the endpoint does not answer yet; stderr:\n%s", tail(p.stderr))
	}
	status := statusAddr(t, p)
	ln, err := net.Listen("tcp", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ep := newRotatingEndpointOn(t, ln, other)
	holdsWhileRefused(ctx, t, p, status, dlq)
	ep.rotate(trusted)
	deliversOnceFixed(ctx, t, p, ep, status, dlq, n)
}

// quietLog discards the endpoint's TLS handshake errors.
func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// holdsWhileRefused checks a forwarder whose endpoint's certificate does
// not verify: it says so at ERROR, /readyz answers 503 saying why, and for
// two seconds of refused requests nothing is dead-lettered (before, every
// record that came was, within them).
func holdsWhileRefused(ctx context.Context, t *testing.T, p *process, status, dlq string) {
	t.Helper()
	if !p.stderr.wait(ctx, "refuses every attempt for a configuration error", p.exited) {
		t.Fatalf("no line saying the endpoint refuses every attempt; stderr:\n%s", tail(p.stderr))
	}
	var body string
	for {
		code, b := readyz(ctx, status)
		if body = b; code == http.StatusServiceUnavailable {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("/readyz never answered 503 while the certificate did not verify: %d %q", code, b)
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Logf("GET /readyz while rotated: %s", strings.TrimSpace(body))
	for _, want := range []string{"configuration error", "x509"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz body %q lacks %q", body, want)
		}
	}
	time.Sleep(2 * time.Second)
	if b, err := os.ReadFile(dlq); err == nil && len(b) > 0 {
		t.Errorf("dead letters written while the certificate did not verify:\n%.2000s", b)
	}

}

// deliversOnceFixed checks a forwarder whose endpoint's certificate
// verifies again: every one of n records is delivered, the log says the
// configuration error is over, /readyz is ready again, SIGTERM exits 0,
// nothing was dead-lettered and the ERROR line names the endpoint and the
// x509 error.
func deliversOnceFixed(ctx context.Context, t *testing.T, p *process, ep *rotatingEndpoint, status, dlq string, n int) {
	t.Helper()
	// The second records' values repeat the first's: count answers.
	ep.waitFor(ctx, t, p, "every record delivered once the certificate verifies again", func() bool { return ep.answers() >= n })
	if !p.stderr.wait(ctx, "configuration error is over", p.exited) {
		t.Errorf("no line saying the configuration error is over; stderr:\n%s", tail(p.stderr))
	}
	for {
		code, b := readyz(ctx, status)
		if code == http.StatusOK {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("/readyz did not turn ready once the certificate verified: %d %q", code, b)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	if b, err := os.ReadFile(dlq); err == nil && len(b) > 0 {
		t.Errorf("dead letters written for the certificate:\n%.2000s", b)
	}
	log := p.stderr.String()
	if got := strings.Count(log, "kpar: handler failed"); got > 0 {
		t.Errorf("%d \"handler failed\" lines, want none (one ERROR line per spell); stderr:\n%s", got, tail(p.stderr))
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "refuses every attempt") {
			t.Logf("log: %s", line)
			if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, ep.srv.Listener.Addr().String()) || !strings.Contains(line, "x509") {
				t.Errorf("the line does not say ERROR, the endpoint and the x509 error: %s", line)
			}
		}
		if strings.Contains(line, "configuration error is over") {
			t.Logf("log: %s", line)
		}
	}
}
