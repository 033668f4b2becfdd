package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/kparprom"
)

// connectTimeout bounds how long forward waits for the brokers to answer
// at startup before it gives up.
const connectTimeout = 30 * time.Second

// cmdForward consumes a topic with the kpar engine and POSTs every record to
// an HTTP endpoint (package forward), dead-lettering what the endpoint
// rejects or keeps failing to a Kafka topic.
//
// It exits 0 after SIGINT/SIGTERM once in-flight requests finished (up to
// --shutdown-timeout) and their offsets are committed, 1 when it cannot run
// (brokers unreachable, authentication or TLS failing, a fatal client
// error), and 2 for bad usage.
func cmdForward(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("forward", ` --brokers LIST --group G --topic T --url URL

Consumes topic T as a member of consumer group G with the kpar engine and
POSTs every record to URL: body = the value; headers Kpar-Topic,
Kpar-Partition, Kpar-Offset, Kpar-Timestamp, Kpar-Key (base64; absent for a
nil key) and Kpar-Header-<h> (base64) per record header. A 2xx response
finishes the record. 408, 429, 5xx, connection errors and timeouts are
retried with backoff (Retry-After honoured on 429 and 503); after
--max-attempts, and at once for any other 4xx, the record goes to the
dead-letter topic. Offsets are committed only below finished records; a
new group starts at the oldest record. SIGINT or SIGTERM stops fetching,
finishes in-flight requests, commits and exits 0.`, stderr)
	brokers := fs.String("brokers", "", "comma-separated seed brokers `host:port,...` (required)")
	group := fs.String("group", "", "consumer group `G` (required)")
	topic := fs.String("topic", "", "topic `T` to consume (required)")
	target := fs.String("url", "", "http or https `URL` to POST every record to (required)")
	var ord kpar.Order
	fs.TextVar(&ord, "ordering", kpar.ByKey, "what runs in order, `MODE`: key (one record per key and partition at a time), partition, or unordered")
	concurrency := fs.Int("concurrency", 64, "requests in flight at once, and the size of the keep-alive connection pool")
	maxAttempts := fs.Int("max-attempts", 3, "attempts per record before it is dead-lettered")
	retryBackoff := fs.Duration("retry-backoff", 100*time.Millisecond, "base of the jittered exponential backoff between attempts")
	retryBackoffMax := fs.Duration("retry-backoff-max", 10*time.Second, "cap of the backoff between attempts")
	attemptTimeout := fs.Duration("attempt-timeout", 10*time.Second, "time limit of one request, response included")
	dlqTopic := fs.String("dlq-topic", "", "dead-letter `TOPIC` (default <topic>.dlq)")
	shutdownTimeout := fs.Duration("shutdown-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests may take to finish before they are cancelled")
	sessionTimeout := fs.Duration("session-timeout", 45*time.Second, "how long the group waits for a crashed member before giving its partitions to the others (brokers allow 6s to 30m by default)")
	metricsListen := fs.String("metrics-listen", "", "serve /metrics, the status page, /healthz and /readyz on `host:port` (default off)")
	logLevel := fs.String("log-level", "info", "log `level`: debug, info, warn or error")
	sec := securityFlags(fs)
	if code, ok := fs.parse(args); !ok {
		return code
	}

	if fs.NArg() > 0 {
		return fs.usageError("unexpected argument %q", fs.Arg(0))
	}
	for _, req := range []struct{ name, val string }{
		{"brokers", *brokers}, {"group", *group}, {"topic", *topic}, {"url", *target},
	} {
		if strings.TrimSpace(req.val) == "" {
			return fs.usageError("missing --%s (or %s)", req.name, envName(req.name))
		}
	}
	seeds, err := splitBrokers(*brokers)
	if err != nil {
		return fs.usageError("invalid --brokers: %v", err)
	}
	switch {
	case *concurrency < 1 || *concurrency > 1<<16:
		return fs.usageError("invalid --concurrency %d: want 1 to 65536", *concurrency)
	case *maxAttempts < 1:
		return fs.usageError("invalid --max-attempts %d: want 1 or more", *maxAttempts)
	case *retryBackoff <= 0:
		return fs.usageError("invalid --retry-backoff %v: want more than 0", *retryBackoff)
	case *retryBackoffMax < *retryBackoff:
		return fs.usageError("invalid --retry-backoff-max %v: want at least --retry-backoff (%v)", *retryBackoffMax, *retryBackoff)
	case *attemptTimeout <= 0:
		return fs.usageError("invalid --attempt-timeout %v: want more than 0", *attemptTimeout)
	case *sessionTimeout < time.Second:
		return fs.usageError("invalid --session-timeout %v: want 1s or more", *sessionTimeout)
	case *shutdownTimeout <= 0:
		return fs.usageError("invalid --shutdown-timeout %v: want more than 0", *shutdownTimeout)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fs.usageError("invalid --log-level %q: use debug, info, warn or error", *logLevel)
	}
	if *dlqTopic == "" {
		*dlqTopic = *topic + ".dlq"
	}
	if *dlqTopic == *topic {
		return fs.usageError("invalid --dlq-topic %q: it is the topic being consumed", *dlqTopic)
	}
	h, err := forward.New(*target, forward.Concurrency(*concurrency), forward.Timeout(*attemptTimeout))
	if err != nil {
		return fs.usageError("invalid --url: %v", strings.TrimPrefix(err.Error(), "forward: "))
	}
	defer h.CloseIdleConnections()
	secOpts, err := sec.kgoOpts()
	if err != nil {
		return fs.usageError("%v", err)
	}
	if *metricsListen != "" {
		if _, err := statusListenAddr(*metricsListen); err != nil {
			return fs.usageError("invalid --metrics-listen: %v", strings.TrimPrefix(err.Error(), "status server: "))
		}
	}

	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	fail := func(msg string, err error) int {
		log.Error(msg, "err", err)
		return 1
	}
	if sec.plainTextPassword() {
		log.Warn("SASL PLAIN without TLS sends the password in clear text; add --tls or --tls-ca")
	}

	// Dead letters go through a producer client of their own, with the
	// consumer's seeds and security, placing each on the partition that
	// matches its original (see deadletter.NewKafkaSink).
	dlqClient, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.AllowAutoTopicCreation(),
		kgo.WithLogger(kgoSlog{log.With("client", "dead-letters")}),
	}, secOpts...)...)
	if err != nil {
		return fail("kpar forward: creating the dead-letter client", err)
	}
	defer dlqClient.Close()

	opts := []kpar.ConsumerOpt{
		kpar.Brokers(seeds...),
		kpar.ClientOptions(append([]kgo.Opt{
			kgo.SessionTimeout(*sessionTimeout),
			// Three heartbeats per session timeout, as Kafka advises.
			kgo.HeartbeatInterval(min(3*time.Second, *sessionTimeout/3)),
		}, secOpts...)...),
		kpar.Group(*group),
		kpar.Topics(*topic),
		kpar.Concurrency(*concurrency),
		kpar.Ordering(ord),
		kpar.MaxAttempts(*maxAttempts),
		kpar.RetryBackoff(*retryBackoff, *retryBackoffMax),
		kpar.AttemptTimeout(*attemptTimeout),
		kpar.ShutdownTimeout(*shutdownTimeout),
		kpar.DeadLetters(deadletter.NewKafkaSink(dlqClient, deadletter.TopicName(*dlqTopic))),
		kpar.WithLogger(log),
	}
	var metrics *kparprom.Metrics
	if *metricsListen != "" {
		metrics = kparprom.New()
		opts = append(opts, kpar.WithHooks(metrics), kpar.ClientOptions(metrics.ClientOpts()...))
	}
	c, err := kpar.New(h, opts...)
	if err != nil {
		return fail("kpar forward: invalid configuration", err)
	}

	// The status server outlives the drain that follows a signal, so that
	// /healthz and the page keep answering until the consumer is done.
	statusCtx, stopStatus := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStatus()
	if metrics != nil {
		bound, err := serveStatus(statusCtx, *metricsListen, c, metrics)
		if err != nil {
			return fail("kpar forward: cannot serve --metrics-listen", err)
		}
		*metricsListen = bound
	}

	attrs := []any{
		"brokers", strings.Join(seeds, ","), "group", *group, "topic", *topic,
		"url", redactURL(*target), "ordering", ord.String(), "concurrency", *concurrency,
		"max_attempts", *maxAttempts, "attempt_timeout", *attemptTimeout, "dlq_topic", *dlqTopic,
		"tls", sec.usesTLS(),
	}
	if m := sec.saslMechanism(); m != "" {
		attrs = append(attrs, "sasl", strings.ToLower(m), "sasl_user", sec.user)
	}
	if *metricsListen != "" {
		attrs = append(attrs, "metrics_listen", *metricsListen)
	}
	log.Info("kpar forward starting", attrs...)

	// franz-go retries a failing connection forever, which would hide a
	// wrong password or certificate behind a quiet loop: check first, and
	// stop with the reason.
	if err := sec.checkBrokers(ctx, seeds, connectTimeout); err != nil {
		if ctx.Err() != nil {
			return 0 // stopped before we began: nothing to drain
		}
		return fail("kpar forward: cannot use the brokers", err)
	}

	stopLog := context.AfterFunc(ctx, func() {
		log.Info("kpar forward stopping: finishing in-flight requests, then committing", "shutdown_timeout", *shutdownTimeout)
	})
	defer stopLog()

	if err := c.Run(ctx); err != nil {
		if why := sec.explainConnectError(err); why != nil {
			err = why
		}
		return fail("kpar forward: stopped", err)
	}
	log.Info("kpar forward stopped: in-flight records finished and offsets committed")
	return 0
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

// kgoSlog logs a franz-go client's warnings and errors to slog.
type kgoSlog struct{ l *slog.Logger }

func (k kgoSlog) Level() kgo.LogLevel {
	if k.l.Enabled(context.Background(), slog.LevelDebug) {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

func (k kgoSlog) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelWarn:
		lvl = slog.LevelWarn
	}
	k.l.Log(context.Background(), lvl, "kgo: "+msg, keyvals...)
}
