package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/deadletter/pgsink"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/internal/kgolog"
)

// connectTimeout bounds how long forward waits for the brokers to answer
// at startup before it gives up.
const connectTimeout = 30 * time.Second

// revokeTimeout is kpar's default RevokeTimeout, which kpar forward keeps:
// a rebalance must give a revoke that long.
const revokeTimeout = 10 * time.Second

// cmdForward consumes topics with the kpar engine and POSTs every record
// (or batch of records) to an HTTP endpoint (package forward),
// dead-lettering what the endpoint rejects or keeps failing to a Kafka
// topic, a file or a PostgreSQL table.
//
// It exits 0 after SIGINT/SIGTERM once in-flight requests finished (up to
// --shutdown-timeout) and their offsets are committed, 1 when it cannot run
// (brokers unreachable, authentication or TLS failing, a fatal client
// error), and 2 for bad usage, which includes an https --url whose
// certificate does not verify.
func cmdForward(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fc, code, ok := parseForward(args, stderr)
	if !ok {
		return code
	}
	if code, ok := fc.check(); !ok {
		return code
	}
	var base []forward.Opt
	if *fc.replyTopic != "" {
		base = append(base, forward.Replies(*fc.replyTopic))
	}
	fc.typed.offline = fc.dry.enabled()
	h, secOpts, typedAttrs, code, ok := fc.endpoints(ctx, *fc.replyTopic,
		append(base, forward.Concurrency(*fc.concurrency), forward.Timeout(*fc.att.timeout))...)
	if !ok {
		return code
	}
	defer h.CloseIdleConnections()
	fc.warn()

	dl, closeSink, err := fc.dry.openSink(ctx, fc.sink, fc.seeds, secOpts, fc.log)
	if err != nil {
		return fc.fail("kpar forward: opening the dead-letter sink", err)
	}
	defer closeSink()
	f, err := fc.newForwarder(h, dl, secOpts)
	if err != nil {
		return fc.dry.invalid(fc.fail("kpar forward: invalid configuration", err))
	}

	// The status server outlives the drain that follows a signal, so that
	// /healthz and the page keep answering until the consumer is done.
	statusCtx, stopStatus := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStatus()
	if f.metrics != nil && !fc.dry.enabled() {
		bound, err := serveStatus(statusCtx, *fc.metricsListen, f.c, f.metrics, f.stall, h.collectors()...)
		if err != nil {
			return fc.fail("kpar forward: cannot serve --metrics-listen", err)
		}
		*fc.metricsListen = bound
	}
	attrs := fc.startAttrs(h, typedAttrs)
	if fc.dry.enabled() {
		return fc.dry.report(stdout, attrs)
	}
	fc.log.Info("kpar forward starting", attrs...)
	return f.run(ctx)
}

// forwardUsage is kpar forward's synopsis and description.
const forwardUsage = ` --brokers LIST --group G|--share-group G --topic T [--topic T2...] --url URL

Consumes the topics (or every topic matching --topic-regex) as a member of
consumer group G with the kpar engine, or of share group G (--share-group:
KIP-932, Kafka 4.2+; the broker hands every member records of every
partition, so members are not limited by the partition count; see below),
and POSTs every record to URL. The whole HTTP contract, with examples, is
docs/http-contract.md in the kpar repository.

Request: body = the value. Content-Type = the record's own content-type
header (any case) when it has one, else --content-type (default
application/octet-stream): give --content-type application/json for JSON
records, so that Flask's request.get_json() and express.json() read them
(--header 'Content-Type: ...' means the same). Headers Kpar-Topic,
Kpar-Partition, Kpar-Offset (together the record's idempotency key: a
record can arrive twice), Kpar-Timestamp, Kpar-Key (base64; absent for a
nil key), Kpar-Tombstone: true for a nil value (an empty body without it
is an empty value), Kpar-Headers (every record header in order with its
exact name: "name=base64, ..."), and Kpar-Header-<h> (base64) per record
header, which HTTP merges for names differing only in case. A record's
traceparent and tracestate headers are sent as the request's own, so the
endpoint continues the producer's trace. --cloudevents adds CloudEvents
binary-mode headers: ce-specversion 1.0, ce-id <topic>/<partition>/<offset>,
ce-source, ce-type, ce-time, ce-subject (the key, if text); a record with
ce_* headers (the CloudEvents Kafka binding) keeps its attributes.
With --batch N, up to N records go in one request as a JSON array of
{"topic","partition","offset","timestamp","key","value","content_type",
"headers","header_list"} (key and value base64, null when nil); the
endpoint answers 2xx with an empty body (all done) or a JSON array with
one item per record, in request order: a status (200) or an object
{"status": 422, "error": "why", "retry_after": seconds}.
Batches fill only from records in flight at once, at most one per key
(--ordering key) or partition (--ordering partition): --concurrency
defaults to 8 x --batch then (8 batches in flight), and fewer keys or
partitions than --batch leave batches partial, sent after --batch-wait.
A 2xx response finishes the record. 408, 429, 5xx, connection errors and
timeouts are retried with backoff (Retry-After honoured on 429 and 503);
after --max-attempts (and --retry-topics, if any), and at once for any
other 4xx, the record goes to the dead letters, whose message quotes the
start of the response (or the batch item's "error"). 429, 503, connection
errors and timeouts burn no attempt: an endpoint that is down, overloaded
or hanging is probed with pauses growing to 5s (or, with --adaptive, gets
fewer requests in flight), nothing is dead-lettered for it, and the log
summarises it every 10s; a timeout does burn one when the endpoint
answered other requests meanwhile (the record itself hangs it). An https
URL whose certificate does not verify is refused at start (exit 2; see
--url-ca). --rate-limit and --key-rate-limit cap requests per second. Offsets
are committed only below finished records; a new group starts at the
oldest record. SIGINT or SIGTERM stops fetching, finishes the fetched
records (at the rate limit, if any) for up to --shutdown-timeout, commits
and exits 0.

With --share-group, each record is acknowledged instead of committed:
ACCEPT once the endpoint took it (or once the dead letters did), retries
stay on this member with the lock renewed, and a stop RELEASEs what has
not started to the other members. No order is kept across members;
--ordering key keeps one request per key at a time in this process. A
share group without share.auto.offset.reset gets earliest.`

// skipDeadLetters wraps h for --topic-regex: an expression such as
// ^orders also matches the dead-letter topics orders.dlq, whose records
// must not be forwarded again (nor dead-lettered to orders.dlq.dlq). They
// are passed over as done. (kgo.ConsumeExcludeTopics would keep them from
// being fetched at all, but kpar.ClientOptions cannot take it.)
func skipDeadLetters(h kpar.Handler, sink deadLetterSink, log *slog.Logger) kpar.Handler {
	if sink.scheme != "kafka" {
		return h
	}
	isDLQ := func(topic string) bool { return strings.HasSuffix(topic, ".dlq") }
	if sink.topic != "" {
		isDLQ = func(topic string) bool { return topic == sink.topic }
	}
	var warned sync.Map // topic -> struct{}: one warning per topic
	return kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if !isDLQ(r.Topic) {
			return h.Handle(ctx, r)
		}
		if _, seen := warned.LoadOrStore(r.Topic, struct{}{}); !seen {
			log.Warn("--topic-regex matches a dead-letter topic; its records are not forwarded", "topic", r.Topic)
		}
		return nil
	})
}

// contentTypeFlag checks --content-type and takes a Content-Type given
// with --header or --header-file as its alias, out of extra.
func contentTypeFlag(fs *flagSet, contentType *string, extra http.Header) (code int, ok bool) {
	if vs := extra.Values("Content-Type"); len(vs) > 0 {
		switch {
		case len(vs) > 1:
			return fs.usageError("invalid --header Content-Type: given %d times; give it once (it is --content-type)", len(vs)), false
		case fs.given("content-type") && !strings.EqualFold(vs[0], *contentType):
			return fs.usageError("invalid --header Content-Type %q: it is --content-type, which says %q; give one", vs[0], *contentType), false
		}
		*contentType = vs[0]
		extra.Del("Content-Type")
	}
	if _, err := forward.New("http://localhost/", forward.ContentType(*contentType)); err != nil {
		return fs.usageError("invalid --content-type %q: want a media type such as application/json", *contentType), false
	}
	return 0, true
}

// checkEndpoint checks the certificate of an https --url before the first
// record (forward.Handler.CheckTLS): one that does not verify is a usage
// error (exit 2), an endpoint that cannot be reached yet only a warning.
func checkEndpoint(ctx context.Context, fs *flagSet, h interface{ CheckTLS(context.Context) error }, timeout time.Duration, log *slog.Logger) (code int, ok bool) {
	cctx, cancel := context.WithTimeout(ctx, min(timeout, 10*time.Second))
	defer cancel()
	err := h.CheckTLS(cctx)
	var tlsErr *forward.TLSError
	switch {
	case errors.As(err, &tlsErr):
		return fs.usageError("invalid --url: %s", strings.TrimPrefix(err.Error(), "forward: ")), false
	case err != nil && ctx.Err() == nil:
		log.Warn("kpar forward: the --url endpoint does not answer yet; records wait for it", "err", err)
	}
	return 0, true
}

// listFlag is a repeatable string flag.
type listFlag struct{ values []string }

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

func (l *listFlag) Set(v string) error {
	l.values = append(l.values, v)
	return nil
}

// split returns the values, each also split at sep, trimmed, empty ones
// dropped: --topic a,b and KPAR_HEADER with one header per line.
func (l *listFlag) split(sep string) []string {
	var out []string
	for _, v := range l.values {
		for p := range strings.SplitSeq(v, sep) {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// given reports whether the flag was set on the command line or through
// its environment variable.
func (f *flagSet) given(name string) bool {
	set := false
	f.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	_, env := os.LookupEnv(envName(name))
	return set || env
}

// parseDelays reads --retry-topics: comma-separated durations (the
// library refuses those not above 0).
func parseDelays(s string) ([]time.Duration, error) {
	var ds []time.Duration
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		d, err := time.ParseDuration(p)
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration", p)
		}
		ds = append(ds, d)
	}
	if strings.TrimSpace(s) != "" && len(ds) == 0 {
		return nil, errors.New("no delay in the list")
	}
	return ds, nil
}

// requestHeaders reads --header values and the --header-file lines, each
// "Name: value". Errors name the flag (and line), never the value, which is
// often a secret.
func requestHeaders(flags []string, file string) (http.Header, error) {
	hd := http.Header{}
	add := func(line, where string) error {
		name, value, ok := strings.Cut(line, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" {
			return fmt.Errorf("invalid %s: want 'Name: value'", where)
		}
		if err := checkHeaderField(name, value); err != nil {
			return fmt.Errorf("invalid %s: %v", where, err)
		}
		hd.Add(name, value)
		return nil
	}
	for _, h := range flags {
		name, _, _ := strings.Cut(h, ":")
		if err := add(h, fmt.Sprintf("--header %q", strings.TrimSpace(name))); err != nil {
			return nil, err
		}
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("invalid --header-file: %v", err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := add(line, fmt.Sprintf("--header-file %s line %d", file, i+1)); err != nil {
				return nil, err
			}
		}
	}
	// forward.New knows which names kpar sets itself; ask it now, so that
	// the error names the header flag rather than --url.
	if _, err := forward.New("http://localhost/", forward.Header(hd)); err != nil {
		return nil, fmt.Errorf("invalid --header/--header-file: %v", strings.TrimPrefix(err.Error(), "forward: "))
	}
	return hd, nil
}

// checkHeaderField rejects a header that net/http would refuse to send.
func checkHeaderField(name, value string) error {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return fmt.Errorf("header name %q is not an HTTP token", name)
		}
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return fmt.Errorf("the value of %s has a control character", name)
		}
	}
	return nil
}

// readCAs reads PEM CA certificates.
func readCAs(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// deadLetterSink is a parsed --dead-letters URL: the same forms `kpar dlq
// --source` reads.
type deadLetterSink struct {
	scheme  string   // kafka, file, postgres
	brokers []string // kafka: nil means the consumed cluster
	topic   string   // kafka: "" means <topic>.dlq per topic
	path    string   // file
	dsn     string   // postgres, without kpar_table
	table   string   // postgres
}

func parseDeadLetters(raw string) (deadLetterSink, error) {
	if raw == "" {
		return deadLetterSink{scheme: "kafka"}, nil
	}
	scheme, rest, _ := strings.Cut(raw, "://")
	switch strings.ToLower(scheme) {
	case "kafka":
		hosts, path, _ := strings.Cut(rest, "/")
		if strings.TrimSpace(path) == "" {
			seeds, err := splitBrokers(hosts)
			if err != nil {
				return deadLetterSink{}, fmt.Errorf("%q: %v", raw, err)
			}
			return deadLetterSink{scheme: "kafka", brokers: seeds}, nil
		}
		seeds, ts, err := deadletter.ParseKafkaURL(raw)
		if err != nil {
			return deadLetterSink{}, errors.New(strings.TrimPrefix(err.Error(), "deadletter: "))
		}
		if len(ts) > 1 {
			return deadLetterSink{}, fmt.Errorf("%q: name one topic", raw)
		}
		if _, err := splitBrokers(strings.Join(seeds, ",")); err != nil {
			return deadLetterSink{}, fmt.Errorf("%q: %v", raw, err)
		}
		return deadLetterSink{scheme: "kafka", brokers: seeds, topic: ts[0]}, nil
	case "file":
		if rest == "" {
			return deadLetterSink{}, fmt.Errorf("%q: no path", raw)
		}
		return deadLetterSink{scheme: "file", path: rest}, nil
	case "postgres", "postgresql":
		u, err := url.Parse(raw)
		if err != nil {
			return deadLetterSink{}, fmt.Errorf("not a URL: %v", err)
		}
		q := u.Query()
		table := q.Get(pgsink.TableParam)
		q.Del(pgsink.TableParam)
		u.RawQuery = q.Encode()
		return deadLetterSink{scheme: "postgres", dsn: u.String(), table: table}, nil
	}
	return deadLetterSink{}, fmt.Errorf("%q: want kafka://, file://, postgres:// or postgresql://", redactURL(raw))
}

// describe is the sink for the start-up log line, without passwords.
func (s deadLetterSink) describe() string {
	switch s.scheme {
	case "file":
		return "file://" + s.path
	case "postgres":
		return redactURL(s.dsn)
	}
	where := "the consumed cluster"
	if s.brokers != nil {
		where = strings.Join(s.brokers, ",")
	}
	topic := s.topic
	if topic == "" {
		topic = "<topic>.dlq"
	}
	return fmt.Sprintf("kafka topic %s on %s", topic, where)
}

// open makes the sink. A Kafka sink gets a producer client of its own,
// with the consumer's security, placing each letter on the partition that
// matches its original (see deadletter.NewKafkaSink).
func (s deadLetterSink) open(ctx context.Context, seeds []string, secOpts []kgo.Opt, log *slog.Logger) (deadletter.Sink, func(), error) {
	switch s.scheme {
	case "file":
		fs, err := deadletter.NewFileSink(s.path)
		if err != nil {
			return nil, nil, err
		}
		return fs, func() { _ = fs.Close() }, nil
	case "postgres":
		var opts []pgsink.Opt
		if s.table != "" {
			opts = append(opts, pgsink.Table(s.table))
		}
		ps, err := pgsink.Open(ctx, s.dsn, opts...)
		if err != nil {
			return nil, nil, err
		}
		return ps, ps.Close, nil
	}
	if s.brokers != nil {
		seeds = s.brokers
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.AllowAutoTopicCreation(),
		kgo.WithLogger(kgolog.New(log.With("client", "dead-letters"))),
	}, secOpts...)...)
	if err != nil {
		return nil, nil, err
	}
	// SinkTopic("") keeps the sink's default, <topic>.dlq per topic.
	return deadletter.NewKafkaSink(cl, deadletter.SinkTopic(s.topic), deadletter.SinkLogger(log)), cl.Close, nil
}

// splitBrokers splits a comma-separated list of host:port.
func splitBrokers(s string) ([]string, error) {
	var seeds []string
	for _, b := range strings.Split(s, ",") {
		b = strings.TrimSpace(b)
		if b == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(b); err != nil {
			return nil, fmt.Errorf("%q is not host:port", b)
		}
		seeds = append(seeds, b)
	}
	if len(seeds) == 0 {
		return nil, errors.New("no broker in the list")
	}
	return seeds, nil
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}

// rateFlags checks --rate-limit, --key-rate-limit and their bursts and
// turns them into options.
func rateFlags(fs *flagSet, rate float64, burst int, keyRate float64, keyBurst int) (opts []kpar.FlowOpt, code int, ok bool) {
	for _, f := range []struct {
		name, burstName string
		rate            float64
		burst           int
		opt             func(float64, int) kpar.FlowOpt
	}{
		{"rate-limit", "rate-burst", rate, burst, kpar.RateLimit},
		{"key-rate-limit", "key-rate-burst", keyRate, keyBurst, kpar.KeyRateLimit},
	} {
		switch {
		case !(f.rate >= 0) || math.IsInf(f.rate, 1):
			return nil, fs.usageError("invalid --%s %v: want requests a second above 0 (0.5: one every 2s), or 0 for no limit", f.name, f.rate), false
		case f.burst < 0:
			return nil, fs.usageError("invalid --%s %d: want 1 or more, or 0 for the default", f.burstName, f.burst), false
		case f.rate == 0 && f.burst > 0:
			return nil, fs.usageError("invalid --%s: it needs --%s", f.burstName, f.name), false
		case f.rate > 0:
			opts = append(opts, f.opt(f.rate, defaultBurst(f.rate, f.burst)))
		}
	}
	return opts, 0, true
}

// defaultBurst is burst, or when it is 0 a tenth of a second's worth of
// rate, at least 1: --rate-limit 500 lets no second start more than 550.
func defaultBurst(rate float64, burst int) int {
	if burst > 0 {
		return burst
	}
	return max(1, int(math.Ceil(rate/10)))
}
