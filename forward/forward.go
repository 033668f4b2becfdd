package forward

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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

// ContentTypeHeader is the record header (matched in any case) whose value
// is sent as the request's Content-Type: the CloudEvents Kafka binding's
// name for it.
const ContentTypeHeader = "content-type"

// recordContentType is r's content type: the value of its last
// content-type header (any case) when that is a valid field value, else
// def.
func recordContentType(r *kgo.Record, def string) string {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if k := r.Headers[i].Key; len(k) == len(ContentTypeHeader) && strings.EqualFold(k, ContentTypeHeader) {
			if v := strings.TrimSpace(string(r.Headers[i].Value)); v != "" && validFieldValue(v) {
				return v
			}
			break
		}
	}
	return def
}

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
	contentType   []string      // Content-Type of a record without one, shared
	cloudEvents   *cloudEvents  // nil without CloudEvents
	replyTopic    string        // Replies (reply.go); "" for none
	batch         *batcher      // nil without Batch
	decoder       Decoder       // Decode (decode.go); nil for none
	replyEncoder  ReplyEncoder  // EncodeReplies; nil for none
	tmpl          *http.Request // POST to url, copied for each request
	// answered counts 2xx answers: a request that timed out while it
	// moved had the endpoint answering others, and the timeout is the
	// record's, not an outage (see transportError).
	answered atomic.Uint64
}

var _ kpar.Handler = (*Handler)(nil)

// New returns a Handler that POSTs every record to rawURL, an absolute http
// or https URL.
func New(rawURL string, opts ...Opt) (*Handler, error) {
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
	case c.batch > 1 && c.cloudEvents != nil:
		return nil, fmt.Errorf("forward: CloudEvents sends one event per request; it excludes Batch(%d, ...)", c.batch)
	}
	contentType, err := defaultContentType(&c)
	if err != nil {
		return nil, err
	}
	n := 0
	for k, vs := range c.header {
		if err := checkExtraHeader(k, vs, c.cloudEvents != nil); err != nil {
			return nil, err
		}
		n += len(vs)
	}
	h := &Handler{
		url: u, redactedURL: u.Redacted(), client: c.client,
		timeout: c.timeout, maxRetryAfter: c.maxRetryAfter,
		header: c.header, nHeader: n,
		contentType: []string{contentType}, cloudEvents: c.cloudEvents,
		replyTopic: c.replyTopic,
		decoder:    c.decoder, replyEncoder: c.replyEncoder,
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

// defaultContentType settles the Content-Type of records without one:
// ContentType, or a Content-Type given with Header (its alias, taken out
// of the extra headers), or DefaultContentType.
func defaultContentType(c *cfg) (string, error) {
	ct := strings.TrimSpace(c.contentType)
	if vs, ok := c.header["Content-Type"]; ok {
		delete(c.header, "Content-Type")
		alias := ""
		if len(vs) == 1 {
			alias = strings.TrimSpace(vs[0])
		}
		switch {
		case alias == "":
			return "", fmt.Errorf("forward: Header Content-Type has %d values: give one media type (it is the same as ContentType)", len(vs))
		case ct != "" && !strings.EqualFold(alias, ct):
			return "", fmt.Errorf("forward: Header Content-Type %q and ContentType(%q) disagree: give one", alias, ct)
		}
		ct = alias
	}
	if ct == "" {
		return DefaultContentType, nil
	}
	if mt, _, err := mime.ParseMediaType(ct); err != nil || !strings.Contains(mt, "/") || !validFieldValue(ct) {
		return "", fmt.Errorf("forward: ContentType(%q) is not a media type (type/subtype[; param=value]), such as application/json", ct)
	}
	return ct, nil
}

// checkExtraHeader rejects a Header entry kpar sets itself or that is not
// a valid HTTP field.
func checkExtraHeader(k string, vs []string, cloudEvents bool) error {
	switch {
	case strings.HasPrefix(k, "Kpar-"), k == "Content-Length", k == "Host",
		k == httpTraceParent, k == httpTraceState:
		return fmt.Errorf("forward: Header %q: kpar sets that header itself", k)
	case cloudEvents && strings.HasPrefix(k, "Ce-"):
		return fmt.Errorf("forward: Header %q: with CloudEvents kpar sets the ce- headers itself (ce-source and ce-type are CloudEvents arguments)", k)
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
// kpar.RetryAfter when it asked for a wait), for a request that got no
// answer and for a timeout (see the package documentation), a *TLSError
// marked kpar.Misconfigured for a certificate that does not verify, a
// plain error otherwise.
func (h *Handler) Handle(ctx context.Context, r *kgo.Record) error {
	if h.batch != nil {
		return h.batch.handle(ctx, r)
	}
	dec, err := h.decode(ctx, r)
	if err != nil {
		return err
	}
	ctx, cancel := h.withTimeout(ctx)
	defer cancel()
	req := h.request(ctx, r, dec)
	started := h.answered.Load()
	resp, err := h.do(req)
	if err != nil {
		// (*url.Error names the method and URL.)
		return h.transportError(ctx, started, fmt.Errorf("forward: %w", err))
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		h.answered.Add(1)
		if h.replyTopic != "" {
			return h.emitReply(ctx, r, resp)
		}
		drain(resp)
		return nil
	}
	return h.failure(resp)
}

func noop() {}

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
			return nil, &url.Error{Op: "Post", URL: h.redactedURL, Err: redirectError{err}}
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

// newRequest returns a POST to the URL with body and a header map with
// room for n values. The body is an io.NopCloser over a *bytes.Reader, a
// reader net/http knows to be in memory: it then writes the headers and
// the body in one write, where any other type has it flush the headers
// first (two writes, and two reads at the endpoint, per request). GetBody
// lets net/http rewind for a redirect or a retry on a fresh connection
// without a copy.
func (h *Handler) newRequest(ctx context.Context, body []byte, n int) *http.Request {
	// A copy of the template: WithContext is the one way to give a
	// request its context without parsing the URL again.
	req := h.tmpl.WithContext(ctx)
	req.Header = make(http.Header, n+h.nHeader)
	if len(body) > 0 {
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	} else {
		req.Body = http.NoBody
		req.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
	}
	for k, vs := range h.header {
		req.Header[k] = vs
	}
	return req
}

// request builds the POST for r. The header values are written into one
// buffer and sliced out of one string, so that a record costs a few
// allocations whatever its number of headers.
func (h *Handler) request(ctx context.Context, r *kgo.Record, dec *Decoded) *http.Request {
	nh := len(r.Headers)
	// Exact room (Kpar-Topic, -Partition, -Offset, -Timestamp and
	// Content-Type; the key, the tombstone mark, the record headers,
	// Kpar-Headers and the two trace headers when there are any): up to 8
	// entries a map is one group, one more and it is a table and a
	// directory besides.
	room := 5
	if r.Key != nil {
		room++
	}
	if r.Value == nil {
		room++
	}
	if nh > 0 {
		room += nh + 3
	}
	if h.cloudEvents != nil {
		room += 6
	}
	body := r.Value
	if dec != nil {
		room += 5
		if dec.ValueForm != FormRaw && dec.ValueForm != "" {
			body = dec.Value
		}
	}
	req := h.newRequest(ctx, body, room)
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
	buf = appendTimestamp(buf, r.Timestamp)
	mark()
	if r.Key != nil {
		buf = base64.StdEncoding.AppendEncode(buf, r.Key)
	}
	mark()
	fixed := len(ends)
	// The record headers copied to the request's own: traceparent,
	// tracestate and content-type (the last of each).
	copyAt := [3]int{-1, -1, -1}
	for i, rh := range r.Headers {
		buf = append(buf, HeaderPrefix...)
		buf = appendHeaderName(buf, rh.Key)
		mark()
		buf = base64.StdEncoding.AppendEncode(buf, rh.Value)
		mark()
		switch {
		case rh.Key == TraceParent:
			copyAt[0] = i
		case rh.Key == TraceState:
			copyAt[1] = i
		case len(rh.Key) == len(ContentTypeHeader) && strings.EqualFold(rh.Key, ContentTypeHeader):
			copyAt[2] = i
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
	for _, i := range copyAt {
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
	vals := make([]string, 0, 10+nh)
	set := func(k, v string) {
		vals = append(vals, v)
		hd[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	// The names are already in canonical form, so setting the map directly
	// skips net/http's canonicalisation and keeps record header names as
	// they are on an HTTP/1.1 wire.
	set(HeaderTopic, r.Topic)
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
		if copyAt[j] >= 0 {
			if v := at(fixed + 2*nh + 1 + j); validFieldValue(v) {
				set(name, v)
			}
		}
	}
	hd["Content-Type"] = h.contentType
	if copyAt[2] >= 0 {
		if v := strings.TrimSpace(at(fixed + 2*nh + 3)); v != "" && validFieldValue(v) {
			set("Content-Type", v)
		}
	}
	if h.cloudEvents != nil {
		h.cloudEvents.setHeaders(hd, r)
	}
	if dec != nil {
		setDecodedHeaders(hd, dec)
	}
	return req
}

// Shared header values; net/http never changes a request's values, and
// Header.Add on a one-value, full-capacity slice copies it.
var (
	jsonType  = []string{"application/json"}
	tombstone = []string{"true"}
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

// drain reads what is left of a response body, up to drainLimit, and
// closes it: a body read to its end lets the connection go back to the
// pool. An empty body (the usual 2xx) needs no reading.
func drain(resp *http.Response) {
	if resp.ContentLength != 0 {
		_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
	}
	_ = resp.Body.Close()
}
