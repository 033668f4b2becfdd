package forward

import (
	"crypto/tls"
	"net/http"
	"net/textproto"
	"time"
)

// Opt configures a Handler. Every option's default is in defaultCfg.
type Opt interface{ apply(*cfg) }

type opt func(*cfg)

func (o opt) apply(c *cfg) { o(c) }

type cfg struct {
	client        *http.Client
	concurrency   int
	timeout       time.Duration
	maxRetryAfter time.Duration
	header        http.Header
	tls           *tls.Config
	batch         int
	batchWait     time.Duration
	contentType   string // "": DefaultContentType
	cloudEvents   *cloudEvents
	replyTopic    string       // Replies; "" for none
	decoder       Decoder      // Decode; nil for none
	replyEncoder  ReplyEncoder // EncodeReplies; nil for none
}

// DefaultContentType is the Content-Type of a record that has no
// content-type header, unless ContentType says otherwise.
const DefaultContentType = "application/octet-stream"

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
func Client(c *http.Client) Opt { return opt(func(cfg *cfg) { cfg.client = c }) }

// Concurrency sizes the default client's connection pool: at most n
// connections to the endpoint, all kept alive between requests, overriding
// the default 64. Give it the Consumer's kpar.Concurrency so that every
// worker has a connection and none is opened and closed per request.
func Concurrency(n int) Opt { return opt(func(cfg *cfg) { cfg.concurrency = n }) }

// Timeout bounds one request, from sending it to reading the response,
// overriding the default 30s (kpar's default AttemptTimeout). The request
// also ends when the handler's context does, whichever comes first. 0 means
// no timeout beyond the context's.
func Timeout(d time.Duration) Opt { return opt(func(cfg *cfg) { cfg.timeout = d }) }

// MaxRetryAfter caps the wait a Retry-After header (or a batch answer's
// retry_after) can ask for, overriding the default 5m: a record waiting for
// its retry holds back the later records of its key (or partition) and its
// partition's commit point.
func MaxRetryAfter(d time.Duration) Opt {
	return opt(func(cfg *cfg) { cfg.maxRetryAfter = d })
}

// Header adds h to every request (an API key, an Authorization header),
// after the ones given by earlier Header options. A Content-Type in h is
// the same as ContentType (one value; New refuses it when ContentType says
// otherwise). Other names kpar sets itself (Kpar-*, Ce-* with CloudEvents,
// Content-Length, Host, Traceparent, Tracestate) are refused by New. The
// values are not sent on when a redirect leaves the endpoint's host.
func Header(h http.Header) Opt {
	return opt(func(cfg *cfg) {
		if cfg.header == nil {
			cfg.header = make(http.Header)
		}
		for k, vs := range h {
			k = textproto.CanonicalMIMEHeaderKey(k)
			cfg.header[k] = append(cfg.header[k], vs...)
		}
	})
}

// ContentType sets the Content-Type of the requests of records that have
// no content-type header of their own, overriding the default
// application/octet-stream. A record's own content-type header (any case)
// always wins: it is sent as the request's Content-Type. With Batch, the
// body is JSON and each record's content type goes in its "content_type"
// field. "" means the default.
func ContentType(mediaType string) Opt {
	return opt(func(cfg *cfg) { cfg.contentType = mediaType })
}

// TLSConfig sets the default client's TLS configuration, for an endpoint
// whose certificate comes from a private CA (RootCAs) or that wants a
// client certificate, overriding Go's default (system roots).
func TLSConfig(c *tls.Config) Opt { return opt(func(cfg *cfg) { cfg.tls = c }) }

// Batch makes the Handler send up to n records per request, as a JSON array
// (see the package documentation), overriding the default of one record
// per request with the value as the body. A batch is sent when n records
// are waiting or wait after its first record arrived, whichever comes
// first; wait must be more than 0 when n > 1. Each Handle call still
// returns its own record's outcome.
func Batch(n int, wait time.Duration) Opt {
	return opt(func(cfg *cfg) { cfg.batch, cfg.batchWait = n, wait })
}

// CloudEvents sends every record as a CloudEvent in the HTTP binding's
// binary mode, so that a receiver written for Knative or Dapr, or with a
// CloudEvents SDK, takes it unchanged; off by default. The value stays the
// body and the Kpar-* headers stay; the request gains ce-specversion 1.0,
// ce-id "<topic>/<partition>/<offset>", ce-source, ce-type, ce-time (the
// record's timestamp) and ce-subject (the key, when it is UTF-8 text).
//
// source is the ce-source, where "{topic}" stands for the record's topic;
// "" means the default "kafka://{topic}". eventType is the ce-type; ""
// means the default "dev.kpar.record". A record that carries ce_*
// headers (the CloudEvents Kafka binding) keeps its attributes; see the
// package documentation. It excludes Batch.
func CloudEvents(source, eventType string) Opt {
	return opt(func(cfg *cfg) { cfg.cloudEvents = newCloudEvents(source, eventType) })
}
