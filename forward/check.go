package forward

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
)

// CheckTLS verifies the endpoint's certificate as requests will, before
// the first record: it opens one TLS connection to the URL's host and
// closes it, without sending a request. It returns a *TLSError when the
// certificate does not verify or the endpoint does not speak TLS (a
// configuration error: every request would fail the same way), another
// error when the endpoint cannot be reached (kpar waits for an endpoint
// that is down, so the caller may go on), and nil when the certificate
// verifies. It checks nothing, and returns nil, for an http URL, for a
// Client of the caller's own (its transport is not known) and when a proxy
// stands between.
func (h *Handler) CheckTLS(ctx context.Context) error {
	t, ok := h.rt.(*http.Transport)
	if h.url.Scheme != "https" || !ok {
		return nil
	}
	if t.Proxy != nil {
		if p, err := t.Proxy(&http.Request{URL: h.url}); err != nil || p != nil {
			return nil
		}
	}
	conf := &tls.Config{}
	if t.TLSClientConfig != nil {
		conf = t.TLSClientConfig.Clone()
	}
	if conf.ServerName == "" {
		conf.ServerName = h.url.Hostname()
	}
	addr := h.url.Host
	if h.url.Port() == "" {
		addr = net.JoinHostPort(h.url.Hostname(), "443")
	}
	d := tls.Dialer{Config: conf}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if tlsProblem(err) {
			return &TLSError{Host: h.url.Host, Err: unwrapURLError(err)}
		}
		return fmt.Errorf("forward: cannot reach %s to check its TLS certificate: %w", addr, err)
	}
	return conn.Close()
}
