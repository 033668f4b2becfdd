// Package forward is a kpar.Handler that POSTs records to an HTTP endpoint:
// the handler behind `kpar forward`, which makes kpar usable from any
// language that can serve HTTP. It sends one request per record, or, with
// Batch, one request per group of records.
//
// # Request, one record
//
// Each record becomes one POST to the URL. The body is the record's value,
// sent from the record's own bytes without a copy (an empty body for a nil
// or an empty value; Kpar-Tombstone tells them apart). The headers describe
// the record:
//
//	Kpar-Topic:       the topic
//	Kpar-Partition:   the partition, decimal
//	Kpar-Offset:      the offset, decimal
//	Kpar-Timestamp:   the record's timestamp, RFC 3339 in UTC with milliseconds
//	Kpar-Key:         the key, standard base64 (absent for a nil key, empty
//	                  for an empty one)
//	Kpar-Tombstone:   "true" when the value is nil (a tombstone); absent
//	                  otherwise, so an empty body without it is an empty value
//	Kpar-Headers:     every record header in record order, exact names:
//	                  "name=base64value, name=base64value, ..." (absent when
//	                  the record has none); see below
//	Kpar-Header-<h>:  for each record header h, its value in standard base64;
//	                  a header repeated in the record is repeated here
//	Traceparent, Tracestate: copied from the record's traceparent and
//	                  tracestate headers (W3C trace context), so that the
//	                  endpoint continues the producer's trace
//
// HTTP header names are case-insensitive, so Kpar-Header-<h> merges record
// headers whose names differ only in case ("Trace" and "trace" arrive as
// one header with two values) and a receiver must not rely on the case of
// <h>. It is kept for compatibility; Kpar-Headers is exact: each item is a
// name, '=', and the value in standard base64; items are separated by ", ".
// In both forms the bytes of a record header name that are not HTTP token
// characters (RFC 9110 tchar), and '%' itself, are percent-encoded as %XX,
// upper-case hex, so names never contain '=' or ',' and decode back to the
// exact bytes: "trace id" is sent as trace%20id.
//
// Both forms travel in the request's head, which servers and proxies limit
// (nginx to 8 KiB a line by default, Go to 1 MiB in all): a record with
// large headers can be refused with 431, a permanent error. Batch puts
// the headers in the body instead.
//
// # Request, a batch
//
// With Batch(n, wait), records are collected into batches of up to n, sent
// when n records are waiting or wait after the first one arrived. The body
// is a JSON array (Content-Type: application/json), one object per record:
//
//	{"topic": "orders", "partition": 3, "offset": 42,
//	 "timestamp": "2024-05-06T05:08:09.123Z",
//	 "key": "base64" or null (nil key),
//	 "value": "base64" or null (nil value, a tombstone),
//	 "headers": {"name": "base64", ...},
//	 "header_list": [["name", "base64"], ...]}
//
// "headers" maps each record header name to its value (the last one when a
// name repeats); "header_list" has them all, in record order. Names are JSON
// strings (bytes that are not valid UTF-8 become U+FFFD). A batch carries
// Traceparent and Tracestate from its first record that has them; the other
// records' trace context is in their own headers.
//
// Batches are made of the records the handler holds at once: kpar's
// ordering gives the handler at most one record per key and partition (Key
// mode) or per partition (Partition mode) at a time, so a batch never holds
// two records whose order matters, whatever the endpoint does with them.
// Batches fill only when kpar runs at least n handlers at once, and kpar's
// Concurrency bounds records, not requests: at Concurrency c about c/n
// batches are in flight. Give kpar a Concurrency of several times n (kpar
// forward uses 8n); fewer keys (Key mode) or partitions (Partition mode)
// than n leave batches partial, sent after wait. The connection pool
// (Concurrency here) only needs c/n connections.
//
// # Response
//
// A 2xx response means the record is done. 408, 429 and 5xx responses,
// connection errors and timeouts are retryable errors: kpar retries the
// record with backoff, and a 429 or 503 with a Retry-After header (seconds or
// an HTTP date) is retried no sooner than it says (kpar.RetryAfter), capped
// at MaxRetryAfter. Any other 4xx and a redirect that cannot be followed
// with the body (301, 302, 303) are permanent (kpar.Permanent): kpar
// dead-letters the record at once. 307 and 308 redirects are followed with
// the body (without the extra Header values when the redirect leaves the
// host). Errors carry a *StatusError when the server answered.
//
// A batch's response applies to all its records, except a 2xx whose body is
// a JSON array of integers, one status per record in request order, each
// read as the status of that record's own request (2xx done, 408, 429 and
// 5xx retried, other 4xx dead-lettered). A 2xx with an empty body finishes
// every record; a 2xx with any other body, or an array of the wrong length,
// is a retryable error for all of them (the endpoint is broken, not the
// records).
//
// Response bodies are read (up to 64 KiB, of which the first 512 bytes go
// into the error of a failed request) and closed so that connections are
// reused: the Handler keeps a keep-alive pool of Concurrency connections to
// the endpoint.
package forward

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// Request header names. HeaderPrefix is followed by the record header's name.
const (
	HeaderTopic     = "Kpar-Topic"
	HeaderPartition = "Kpar-Partition"
	HeaderOffset    = "Kpar-Offset"
	HeaderTimestamp = "Kpar-Timestamp"
	HeaderKey       = "Kpar-Key"
	HeaderTombstone = "Kpar-Tombstone"
	HeaderHeaders   = "Kpar-Headers"
	HeaderPrefix    = "Kpar-Header-"
)

// W3C trace context: the record headers copied to the request's own
// headers (the HTTP names are their canonical forms).
const (
	TraceParent = "traceparent"
	TraceState  = "tracestate"

	httpTraceParent = "Traceparent"
	httpTraceState  = "Tracestate"
)

// TimestampLayout is the layout of the Kpar-Timestamp header: RFC 3339 with
// milliseconds, the precision of Kafka timestamps. It is always in UTC.
const TimestampLayout = "2006-01-02T15:04:05.000Z07:00"

const (
	// drainLimit bounds how much of a response body is read so that its
	// connection can be reused; a longer body closes the connection.
	drainLimit = 64 << 10
	// snippetLimit bounds how much of a failed response's body goes into
	// its error (and so into the dead letter's message).
	snippetLimit = 512
	// maxRedirects bounds the 307/308 redirects followed for one request.
	maxRedirects = 10
)

// Option configures a Handler.
type Option interface{ apply(*cfg) }

type option func(*cfg)

func (o option) apply(c *cfg) { o(c) }

type cfg struct {
	client        *http.Client
	concurrency   int
	timeout       time.Duration
	maxRetryAfter time.Duration
	header        http.Header
	tls           *tls.Config
	batch         int
	batchWait     time.Duration
}

func defaultCfg() cfg {
	return cfg{
		concurrency:   64,
		timeout:       30 * time.Second,
		maxRetryAfter: 5 * time.Minute,
		batch:         1,
		batchWait:     5 * time.Millisecond,
	}
}

// Client sets the HTTP client, overriding the default: a client of its own
// with a keep-alive pool of Concurrency connections that follows only 307
// and 308 redirects. The client is used as it is, so Concurrency and
// TLSConfig do not apply to it; the Handler still applies Timeout on top
// of the client's own timeout.
func Client(c *http.Client) Option { return option(func(cfg *cfg) { cfg.client = c }) }

// Concurrency sizes the default client's connection pool: at most n
// connections to the endpoint, all kept alive between requests, overriding
// the default 64. Give it the Consumer's kpar.Concurrency so that every
// worker has a connection and none is opened and closed per request.
func Concurrency(n int) Option { return option(func(cfg *cfg) { cfg.concurrency = n }) }

// Timeout bounds one request, from sending it to reading the response,
// overriding the default 30s (kpar's default AttemptTimeout). The request
// also ends when the handler's context does, whichever comes first. 0 means
// no timeout beyond the context's.
func Timeout(d time.Duration) Option { return option(func(cfg *cfg) { cfg.timeout = d }) }

// MaxRetryAfter caps the wait a Retry-After header can ask for, overriding
// the default 5m: a record waiting for its retry holds back the later
// records of its key (or partition) and its partition's commit point.
func MaxRetryAfter(d time.Duration) Option {
	return option(func(cfg *cfg) { cfg.maxRetryAfter = d })
}

// Header adds h to every request (an API key, an Authorization header),
// after the ones given by earlier Header options. Names kpar sets itself
// (Kpar-*, Content-Type, Content-Length, Host, Traceparent, Tracestate)
// are rejected by New. The values are not sent on when a redirect leaves
// the endpoint's host.
func Header(h http.Header) Option {
	return option(func(cfg *cfg) {
		if cfg.header == nil {
			cfg.header = make(http.Header)
		}
		for k, vs := range h {
			k = textproto.CanonicalMIMEHeaderKey(k)
			cfg.header[k] = append(cfg.header[k], vs...)
		}
	})
}

// TLSConfig sets the default client's TLS configuration, for an endpoint
// whose certificate comes from a private CA (RootCAs) or that wants a
// client certificate, overriding Go's default (system roots).
func TLSConfig(c *tls.Config) Option { return option(func(cfg *cfg) { cfg.tls = c }) }

// Batch makes the Handler send up to n records per request, as a JSON array
// (see the package documentation), overriding the default of one record
// per request with the value as the body. A batch is sent when n records
// are waiting or wait after its first record arrived, whichever comes
// first; wait must be more than 0 when n > 1. Each Handle call still
// returns its own record's outcome.
func Batch(n int, wait time.Duration) Option {
	return option(func(cfg *cfg) { cfg.batch, cfg.batchWait = n, wait })
}

// Handler POSTs records to one URL. It implements kpar.Handler and is safe
// for concurrent use.
type Handler struct {
	url           *url.URL
	redactedURL   string
	client        *http.Client
	rt            http.RoundTripper // set when client is ours: requests skip http.Client
	timeout       time.Duration
	maxRetryAfter time.Duration
	header        http.Header   // extra headers, canonical names
	nHeader       int           // values in header
	batch         *batcher      // nil without Batch
	tmpl          *http.Request // POST to url, copied for each request
}

var _ kpar.Handler = (*Handler)(nil)

// New returns a Handler that POSTs every record to rawURL, an absolute http
// or https URL.
func New(rawURL string, opts ...Option) (*Handler, error) {
	c := defaultCfg()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	u, err := url.Parse(rawURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("forward: invalid URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("forward: URL %q: scheme must be http or https", u.Redacted())
	case u.Host == "":
		return nil, fmt.Errorf("forward: URL %q has no host", u.Redacted())
	case c.concurrency < 1:
		return nil, fmt.Errorf("forward: Concurrency(%d) out of range: want 1 or more", c.concurrency)
	case c.timeout < 0:
		return nil, fmt.Errorf("forward: Timeout(%v) out of range: want 0 (none) or more", c.timeout)
	case c.maxRetryAfter < 0:
		return nil, fmt.Errorf("forward: MaxRetryAfter(%v) out of range: want 0 or more", c.maxRetryAfter)
	case c.batch < 1:
		return nil, fmt.Errorf("forward: Batch(%d, ...) out of range: want 1 or more", c.batch)
	case c.batch > 1 && c.batchWait <= 0:
		return nil, fmt.Errorf("forward: Batch(%d, %v): the wait must be more than 0", c.batch, c.batchWait)
	}
	n := 0
	for k, vs := range c.header {
		if err := checkExtraHeader(k, vs); err != nil {
			return nil, err
		}
		n += len(vs)
	}
	h := &Handler{
		url: u, redactedURL: u.Redacted(), client: c.client,
		timeout: c.timeout, maxRetryAfter: c.maxRetryAfter,
		header: c.header, nHeader: n,
	}
	h.tmpl = &http.Request{
		Method: http.MethodPost, URL: u, Host: u.Host,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
	}
	if h.client == nil {
		h.client = defaultClient(c.concurrency, c.tls)
		h.rt = h.client.Transport
	}
	if c.batch > 1 {
		h.batch = &batcher{h: h, n: c.batch, wait: c.batchWait}
	}
	return h, nil
}

// checkExtraHeader rejects a Header entry kpar sets itself or that is not
// a valid HTTP field.
func checkExtraHeader(k string, vs []string) error {
	switch {
	case strings.HasPrefix(k, "Kpar-"), k == "Content-Type", k == "Content-Length", k == "Host",
		k == httpTraceParent, k == httpTraceState:
		return fmt.Errorf("forward: Header %q: kpar sets that header itself", k)
	case k == "" || strings.IndexFunc(k, func(r rune) bool { return r > 0x7f || !isTchar(byte(r)) }) >= 0:
		return fmt.Errorf("forward: Header %q: not a valid HTTP header name", k)
	}
	for _, v := range vs {
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("forward: Header %q: value contains a line break or NUL", k)
		}
	}
	return nil
}

// defaultClient has a keep-alive pool of n connections per host, so that n
// workers never open a connection per request, and follows only the
// redirects that keep the method and body.
func defaultClient(n int, tc *tls.Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = n
	t.MaxIdleConnsPerHost = n
	t.MaxConnsPerHost = n
	// Bodies are drained, never read: asking for gzip would only cost a
	// header and a decompressor per response.
	t.DisableCompression = true
	if tc != nil {
		t.TLSClientConfig = tc.Clone()
	}
	return &http.Client{
		Transport:     t,
		CheckRedirect: checkRedirect,
	}
}

// checkRedirect follows only 307 and 308: after 301/302/303 net/http would
// resend a POST as a GET without the body, and the record would be lost on
// the way. Returning the redirect makes it a permanent error instead.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if req.Method != http.MethodPost {
		return http.ErrUseLastResponse
	}
	if len(via) >= maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	return nil
}

// CloseIdleConnections closes the pool's idle connections, for a clean exit.
func (h *Handler) CloseIdleConnections() { h.client.CloseIdleConnections() }

// Handle POSTs r (alone, or in a batch with Batch) and classifies the
// outcome: nil for a 2xx response, a kpar.Permanent error for a response
// that retrying cannot change, kpar.Overloaded for a 429 or 503 (with
// kpar.RetryAfter when it asked for a wait) and for a request that got no
// answer, a plain error otherwise.
func (h *Handler) Handle(ctx context.Context, r *kgo.Record) error {
	if h.batch != nil {
		return h.batch.handle(ctx, r)
	}
	ctx, cancel := h.withTimeout(ctx)
	defer cancel()
	req := h.request(ctx, r)
	resp, err := h.do(req)
	if err != nil {
		// Connection errors, timeouts, and the context ending: retryable.
		// (*url.Error names the method and URL.)
		return transportError(ctx, fmt.Errorf("forward: %w", err))
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		drain(resp)
		return nil
	}
	return h.failure(resp)
}

func noop() {}

// transportError marks a request that got no answer (connection refused or
// reset, a timeout) as the endpoint pushing back, kpar.Overloaded: an
// endpoint that is down is probed ever more slowly (kpar's breaker, or
// kpar.AdaptiveConcurrency) instead of having every record's attempts burnt
// and dead-lettered.
// Not when ctx itself ended: kpar stopped the attempt.
func transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	return kpar.Overloaded(err)
}

// withTimeout applies Timeout unless ctx already ends sooner (kpar's
// attempt deadline usually does), which saves a timer per request.
func (h *Handler) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if h.timeout <= 0 {
		return ctx, noop
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= h.timeout {
		return ctx, noop
	}
	return context.WithTimeout(ctx, h.timeout)
}

// failure reads a non-2xx response into its error and closes it.
func (h *Handler) failure(resp *http.Response) error {
	serr := &StatusError{StatusCode: resp.StatusCode, Status: resp.Status, URL: h.redactedURL}
	serr.Body = snippet(resp.Body)
	drain(resp)
	return h.classify(serr, resp.Header.Get("Retry-After"))
}

// classify wraps serr as its status requires.
func (h *Handler) classify(serr *StatusError, retryAfter string) error {
	switch c := serr.StatusCode; {
	case c >= 200 && c <= 299:
		return nil
	case c == http.StatusTooManyRequests || c == http.StatusServiceUnavailable:
		// The endpoint pushing back (kpar.Overloaded: see
		// kpar.AdaptiveConcurrency), with the wait it asked for, if any.
		if d, ok := parseRetryAfter(retryAfter, time.Now()); ok {
			serr.RetryAfter = min(d, h.maxRetryAfter)
			return kpar.Overloaded(kpar.RetryAfter(serr, serr.RetryAfter))
		}
		return kpar.Overloaded(serr)
	case c == http.StatusRequestTimeout || c >= 500:
		return serr
	case c >= 300 && c <= 499:
		return kpar.Permanent(serr)
	}
	// 1xx as a final answer, or outside HTTP's range: a broken server or
	// proxy, which may be fixed.
	return serr
}

// do sends req. With the default client it goes straight to the
// transport, following 307 and 308 itself: http.Client would copy every
// request's headers for redirects it will never follow, and set up a
// deadline timer the context already gives.
func (h *Handler) do(req *http.Request) (*http.Response, error) {
	if h.rt == nil {
		return h.client.Do(req)
	}
	for n := 0; ; n++ {
		resp, err := h.rt.RoundTrip(req)
		if err != nil {
			return nil, &url.Error{Op: "Post", URL: h.redactedURL, Err: err}
		}
		if resp.StatusCode != http.StatusTemporaryRedirect && resp.StatusCode != http.StatusPermanentRedirect {
			return resp, nil
		}
		loc := resp.Header.Get("Location")
		if loc == "" {
			return resp, nil // nothing to follow: the status stands
		}
		next, err := req.URL.Parse(loc)
		if err == nil && n >= maxRedirects {
			err = fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		if err == nil && next.Scheme != "http" && next.Scheme != "https" {
			err = fmt.Errorf("redirect to unsupported scheme %q", next.Scheme)
		}
		drain(resp)
		if err != nil {
			return nil, &url.Error{Op: "Post", URL: h.redactedURL, Err: err}
		}
		var body io.ReadCloser = http.NoBody
		if req.GetBody != nil {
			if body, err = req.GetBody(); err != nil {
				return nil, &url.Error{Op: "Post", URL: h.redactedURL, Err: err}
			}
		}
		hd := req.Header
		if next.Host != req.URL.Host && len(h.header) > 0 {
			// Like http.Client with Authorization: credentials stay with
			// the host they were given for.
			hd = hd.Clone()
			for k := range h.header {
				delete(hd, k)
			}
		}
		nreq := req.Clone(req.Context())
		nreq.URL, nreq.Host, nreq.Header, nreq.Body = next, "", hd, body
		req = nreq
	}
}

// newRequest returns a POST to the URL with body (bytes read in place: a
// bytes.Reader lets net/http rewind for a redirect or a retry on a fresh
// connection without a copy) and a header map with room for n values.
func (h *Handler) newRequest(ctx context.Context, body []byte, n int) *http.Request {
	// A copy of the template: WithContext is the one way to give a
	// request its context without parsing the URL again.
	req := h.tmpl.WithContext(ctx)
	req.Header = make(http.Header, n+h.nHeader)
	if len(body) > 0 {
		br := newRewindable(body)
		req.Body, req.ContentLength, req.GetBody = br, int64(len(body)), br.rewind
	} else {
		req.Body = http.NoBody
		req.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
	}
	for k, vs := range h.header {
		req.Header[k] = vs
	}
	return req
}

// rewindable is a request body over bytes that net/http can start again.
type rewindable struct {
	bytes.Reader
	data []byte
}

func newRewindable(b []byte) *rewindable {
	r := &rewindable{data: b}
	r.Reset(b)
	return r
}

func (b *rewindable) Close() error { return nil }

func (b *rewindable) rewind() (io.ReadCloser, error) { return newRewindable(b.data), nil }

// request builds the POST for r. The header values are written into one
// buffer and sliced out of one string, so that a record costs a few
// allocations whatever its number of headers.
func (h *Handler) request(ctx context.Context, r *kgo.Record) *http.Request {
	nh := len(r.Headers)
	req := h.newRequest(ctx, r.Value, 8+nh)
	hd := req.Header

	// Sizes: decimal numbers, the timestamp, base64 of the key, and per
	// header its escaped name twice (Kpar-Header-<h> and Kpar-Headers)
	// plus base64 of its value twice.
	size := 20 + 20 + len(TimestampLayout) + base64.StdEncoding.EncodedLen(len(r.Key))
	for _, rh := range r.Headers {
		size += 2*(len(HeaderPrefix)+len(rh.Key)) + 2*base64.StdEncoding.EncodedLen(len(rh.Value)) + 3
	}
	buf := make([]byte, 0, size)
	// ends[i] is where value i ends in buf.
	var endsArr [24]int
	ends := endsArr[:0]
	mark := func() { ends = append(ends, len(buf)) }

	buf = strconv.AppendInt(buf, int64(r.Partition), 10)
	mark()
	buf = strconv.AppendInt(buf, r.Offset, 10)
	mark()
	buf = r.Timestamp.UTC().AppendFormat(buf, TimestampLayout)
	mark()
	if r.Key != nil {
		buf = base64.StdEncoding.AppendEncode(buf, r.Key)
	}
	mark()
	fixed := len(ends)
	traceAt := [2]int{-1, -1}
	for i, rh := range r.Headers {
		buf = append(buf, HeaderPrefix...)
		buf = appendHeaderName(buf, rh.Key)
		mark()
		buf = base64.StdEncoding.AppendEncode(buf, rh.Value)
		mark()
		switch rh.Key {
		case TraceParent:
			traceAt[0] = i
		case TraceState:
			traceAt[1] = i
		}
	}
	for i, rh := range r.Headers {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = appendHeaderName(buf, rh.Key)
		buf = append(buf, '=')
		buf = base64.StdEncoding.AppendEncode(buf, rh.Value)
	}
	mark()
	for _, i := range traceAt {
		if i >= 0 {
			buf = append(buf, r.Headers[i].Value...)
		}
		mark()
	}
	s := string(buf)
	at := func(i int) string {
		from := 0
		if i > 0 {
			from = ends[i-1]
		}
		return s[from:ends[i]]
	}

	// One backing array for the one-value headers; a repeated record
	// header appends past its cap and gets its own.
	vals := make([]string, 0, 8+nh)
	set := func(k, v string) {
		vals = append(vals, v)
		hd[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	// The names are already in canonical form, so setting the map directly
	// skips net/http's canonicalisation and keeps record header names as
	// they are on an HTTP/1.1 wire.
	hd["Content-Type"] = octetStream
	hd[HeaderTopic] = []string{r.Topic}
	set(HeaderPartition, at(0))
	set(HeaderOffset, at(1))
	set(HeaderTimestamp, at(2))
	if r.Key != nil {
		set(HeaderKey, at(3))
	}
	if r.Value == nil {
		hd[HeaderTombstone] = tombstone
	}
	for i := range nh {
		name, v := at(fixed+2*i), at(fixed+2*i+1)
		if old, ok := hd[name]; ok {
			hd[name] = append(old, v)
			continue
		}
		set(name, v)
	}
	if nh > 0 {
		set(HeaderHeaders, at(fixed+2*nh))
	}
	for j, name := range [2]string{httpTraceParent, httpTraceState} {
		if traceAt[j] >= 0 {
			if v := at(fixed + 2*nh + 1 + j); validFieldValue(v) {
				set(name, v)
			}
		}
	}
	return req
}

// Shared header values; net/http never changes a request's values, and
// Header.Add on a one-value, full-capacity slice copies it.
var (
	octetStream = []string{"application/octet-stream"}
	jsonType    = []string{"application/json"}
	tombstone   = []string{"true"}
)

// validFieldValue reports whether v may be sent as an HTTP field value
// (no control characters but tab), so that a damaged trace header in a
// record cannot break the request.
func validFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// appendHeaderName appends k with every byte that is not an HTTP token
// character (RFC 9110 tchar), and '%', percent-encoded, so that any Kafka
// header name makes a valid and reversible HTTP header name.
func appendHeaderName(b []byte, k string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(k); i++ {
		c := k[i]
		if isTchar(c) && c != '%' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	return b
}

// headerName is appendHeaderName as a string.
func headerName(k string) string { return string(appendHeaderName(nil, k)) }

func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date.
// A date in the past means retry now (0).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 63); err == nil {
		if n > uint64(time.Duration(1<<63-1)/time.Second) {
			n = uint64(time.Duration(1<<63-1) / time.Second)
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// snippet reads the start of a failed response's body for its error, as
// valid UTF-8 with surrounding space trimmed.
func snippet(body io.Reader) string {
	buf := make([]byte, snippetLimit)
	n, _ := io.ReadFull(body, buf)
	s := strings.TrimSpace(string(buf[:n]))
	return strings.ToValidUTF8(s, string(utf8.RuneError))
}

// drain reads what is left of a response body, up to drainLimit, and
// closes it: a body read to its end lets the connection go back to the
// pool. An empty body (the usual 2xx) needs no reading.
func drain(resp *http.Response) {
	if resp.ContentLength != 0 {
		_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
	}
	_ = resp.Body.Close()
}

// StatusError is a response that was not 2xx, or in a batch a record's own
// status that was not. Handle returns it wrapped in kpar.Permanent or
// kpar.RetryAfter as its status requires; errors.As finds it through both.
type StatusError struct {
	StatusCode int    // the response's status code, or the record's in a batch
	Status     string // the response's status line, "500 Internal Server Error"
	URL        string // the URL posted to, with any password redacted
	// Body is the start of the response body (up to 512 bytes, as text),
	// which often says what was wrong with the record. Empty for a
	// record's own status in a batch's answer.
	Body string
	// RetryAfter is the wait the server asked for with Retry-After on a 429
	// or 503, capped at MaxRetryAfter; 0 when it asked for none.
	RetryAfter time.Duration
	// Batch is the number of records in the request when it was a batch
	// (Batch option), else 0.
	Batch int
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("forward: POST %s: %s", e.URL, e.Status)
	if e.Batch > 0 {
		msg += fmt.Sprintf(" (in a batch of %d)", e.Batch)
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}
