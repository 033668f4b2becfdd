// Package forward is a kpar.Handler that POSTs every record to an HTTP
// endpoint: the handler behind `kpar forward`, which makes kpar usable from
// any language that can serve HTTP.
//
// # Request
//
// Each record becomes one POST to the URL. The body is the record's value,
// sent from the record's own bytes without a copy (an empty body for a nil
// value). The headers describe the record:
//
//	Kpar-Topic:       the topic
//	Kpar-Partition:   the partition, decimal
//	Kpar-Offset:      the offset, decimal
//	Kpar-Timestamp:   the record's timestamp, RFC 3339 in UTC with milliseconds
//	Kpar-Key:         the key, standard base64 (absent for a nil key, empty
//	                  for an empty one)
//	Kpar-Header-<h>:  for each record header h, its value in standard base64;
//	                  a header repeated in the record is repeated here
//
// HTTP header names are case-insensitive tokens, so a receiver must not rely
// on the case of <h>, and the bytes of a record header name that are not
// allowed in an HTTP header name (and '%' itself) are sent percent-encoded
// as %XX, upper-case hex: "trace id" arrives as Kpar-Header-trace%20id.
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
// the body. Errors carry a *StatusError when the server answered.
//
// Response bodies are read (up to 64 KiB, of which the first 512 bytes go
// into the error of a failed request) and closed so that connections are
// reused: the Handler keeps a keep-alive pool of Concurrency connections to
// the endpoint.
package forward

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
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
	HeaderPrefix    = "Kpar-Header-"
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
}

func defaultCfg() cfg {
	return cfg{
		concurrency:   64,
		timeout:       30 * time.Second,
		maxRetryAfter: 5 * time.Minute,
	}
}

// Client sets the HTTP client, overriding the default: a client of its own
// with a keep-alive pool of Concurrency connections that follows only 307
// and 308 redirects. The client is used as it is, so Concurrency does not
// size its pool; the Handler still applies Timeout on top of the client's
// own timeout.
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

// Handler POSTs records to one URL. It implements kpar.Handler and is safe
// for concurrent use.
type Handler struct {
	url           string
	client        *http.Client
	timeout       time.Duration
	maxRetryAfter time.Duration
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
	}
	if c.client == nil {
		c.client = defaultClient(c.concurrency)
	}
	return &Handler{url: rawURL, client: c.client, timeout: c.timeout, maxRetryAfter: c.maxRetryAfter}, nil
}

// defaultClient has a keep-alive pool of n connections per host, so that n
// workers never open a connection per request, and follows only the
// redirects that keep the method and body.
func defaultClient(n int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = n
	t.MaxIdleConnsPerHost = n
	t.MaxConnsPerHost = n
	return &http.Client{
		Transport: t,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			// After 301/302/303 net/http would resend a POST as a GET
			// without the body: the record would be lost on the way.
			// Returning the redirect makes it a permanent error instead.
			if req.Method != http.MethodPost {
				return http.ErrUseLastResponse
			}
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			return nil
		},
	}
}

// CloseIdleConnections closes the pool's idle connections, for a clean exit.
func (h *Handler) CloseIdleConnections() { h.client.CloseIdleConnections() }

// Handle POSTs r and classifies the outcome: nil for a 2xx response, a
// kpar.Permanent error for a response that retrying cannot change, a plain
// or kpar.RetryAfter error otherwise.
func (h *Handler) Handle(ctx context.Context, r *kgo.Record) error {
	if h.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.timeout)
		defer cancel()
	}
	req, err := h.request(ctx, r)
	if err != nil {
		return kpar.Permanent(err)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		// Connection errors, timeouts, and the context ending: retryable.
		// (*url.Error names the method and URL.)
		return fmt.Errorf("forward: %w", err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		drain(resp.Body)
		return nil
	}
	serr := &StatusError{StatusCode: resp.StatusCode, Status: resp.Status, URL: redacted(h.url)}
	serr.Body = snippet(resp.Body)
	drain(resp.Body)
	switch c := resp.StatusCode; {
	case c == http.StatusTooManyRequests || c == http.StatusServiceUnavailable:
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			serr.RetryAfter = min(d, h.maxRetryAfter)
			return kpar.RetryAfter(serr, serr.RetryAfter)
		}
		return serr
	case c == http.StatusRequestTimeout || c >= 500:
		return serr
	case c >= 300 && c <= 499:
		return kpar.Permanent(serr)
	}
	// 1xx as a final answer, or outside HTTP's range: a broken server or
	// proxy, which may be fixed.
	return serr
}

// request builds the POST for r. Its body reads r.Value in place: a
// bytes.Reader lets net/http set Content-Length and rewind for a redirect
// or a retry on a fresh connection without a copy.
func (h *Handler) request(ctx context.Context, r *kgo.Record) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(r.Value))
	if err != nil {
		return nil, fmt.Errorf("forward: %w", err)
	}
	// The names are already in canonical form, so setting the map directly
	// skips net/http's canonicalisation and keeps record header names as
	// they are on an HTTP/1.1 wire.
	hd := req.Header
	hd["Content-Type"] = []string{"application/octet-stream"}
	hd[HeaderTopic] = []string{r.Topic}
	hd[HeaderPartition] = []string{strconv.FormatInt(int64(r.Partition), 10)}
	hd[HeaderOffset] = []string{strconv.FormatInt(r.Offset, 10)}
	hd[HeaderTimestamp] = []string{r.Timestamp.UTC().Format(TimestampLayout)}
	if r.Key != nil {
		hd[HeaderKey] = []string{base64.StdEncoding.EncodeToString(r.Key)}
	}
	for _, rh := range r.Headers {
		name := HeaderPrefix + headerName(rh.Key)
		hd[name] = append(hd[name], base64.StdEncoding.EncodeToString(rh.Value))
	}
	return req, nil
}

// headerName returns k with every byte that is not an HTTP token character
// (RFC 9110 tchar), and '%', percent-encoded, so that any Kafka header name
// makes a valid and reversible HTTP header name.
func headerName(k string) string {
	clean := true
	for i := 0; i < len(k); i++ {
		if !isTchar(k[i]) || k[i] == '%' {
			clean = false
			break
		}
	}
	if clean {
		return k
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(k) + 8)
	for i := 0; i < len(k); i++ {
		c := k[i]
		if isTchar(c) && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

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

// drain reads what is left of a body, up to drainLimit, and closes it: a
// body read to its end lets the connection go back to the pool.
func drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, drainLimit))
	_ = body.Close()
}

func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}

// StatusError is a response that was not 2xx. Handle returns it wrapped in
// kpar.Permanent or kpar.RetryAfter as its status requires; errors.As finds
// it through both.
type StatusError struct {
	StatusCode int    // the response's status code
	Status     string // the response's status line, "500 Internal Server Error"
	URL        string // the URL posted to, with any password redacted
	// Body is the start of the response body (up to 512 bytes, as text),
	// which often says what was wrong with the record.
	Body string
	// RetryAfter is the wait the server asked for with Retry-After on a 429
	// or 503, capped at MaxRetryAfter; 0 when it asked for none.
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("forward: POST %s: %s", e.URL, e.Status)
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}
