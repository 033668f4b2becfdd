package main

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/kparprom"
)

// forwarder is kpar forward once its configuration is checked: the
// consumer and what watches it.
type forwarder struct {
	*forwardConfig
	h       *endpoints
	c       *kpar.Consumer
	metrics *kparprom.Metrics // nil without --metrics-listen
	stall   *stallWatch       // /readyz from progress (readiness.go); nil without --metrics-listen
	reach   *brokerWatch      // unreachable brokers, a held join: brokerwatch.go
}

// newForwarder makes the consumer of h with the dead-letter sink dl, and
// the hooks of --metrics-listen and of the broker watch.
func (fc *forwardConfig) newForwarder(h *endpoints, dl deadletter.Sink, secOpts []kgo.Opt) (*forwarder, error) {
	f := &forwarder{forwardConfig: fc, h: h, reach: newBrokerWatch(fc.log, "kpar forward")}
	opts := fc.consumerOpts(dl, secOpts)
	if *fc.metricsListen != "" {
		f.metrics = kparprom.New()
		opts = append(opts, kpar.WithHooks(f.metrics), kpar.ClientOptions(f.metrics.ClientOpts()...))
		f.stall = newStallWatch(fc.readyStall.grace(*fc.att.timeout))
		f.stall.brokers = f.reach
		opts = append(opts, f.stall.opts()...)
	}
	opts = append(opts, f.reach.opts()...)
	var handler kpar.Handler = h
	if len(fc.regexList) > 0 {
		handler = skipDeadLetters(h, fc.sink, fc.log)
	}
	var err error
	f.c, err = kpar.New(handler, opts...)
	return f, err
}

// warn logs what the flags ask for that works, but not as well as it
// could.
func (fc *forwardConfig) warn() {
	if fc.protocol == kpar.ConsumerProtocol && fc.fs.given("session-timeout") {
		fc.log.Warn("--session-timeout does not apply with --group-protocol consumer: the broker sets the session timeout (the group's consumer.session.timeout.ms, else group.consumer.session.timeout.ms, 45s by default; kpar broker --consumer-session-timeout)")
	}
	fc.warnPlainText()
	if *fc.req.batch > 1 && *fc.concurrency < 2**fc.req.batch {
		fc.log.Warn("--concurrency is below 2 x --batch: batches cannot fill while one is in flight, and go out after --batch-wait",
			"concurrency", *fc.concurrency, "batch", *fc.req.batch)
	}
}

// groupAttr is the start line's key and value of the group.
func (fc *forwardConfig) groupAttr() (key, name string) {
	if fc.share {
		return "share_group", *fc.shareGroup
	}
	return "group", *fc.group
}

// startAttrs are the start line's fields, which --check-config prints.
func (fc *forwardConfig) startAttrs(h *endpoints, typedAttrs []any) []any {
	groupKey, groupName := fc.groupAttr()
	attrs := []any{
		"brokers", strings.Join(fc.seeds, ","), groupKey, groupName,
		"url", redactURL(*fc.target), "ordering", fc.ord.String(), "concurrency", *fc.concurrency,
		"max_attempts", *fc.att.maxAttempts, "attempt_timeout", *fc.att.timeout,
		"dead_letters", fc.sink.describe(), "tls", fc.sec.usesTLS(),
	}
	attrs = append(attrs, contentTypeAttrs(*fc.req.batch, *fc.req.contentType, *fc.typed.registry != "", *fc.typed.undecodable)...)
	attrs = append(attrs, fc.limits.attrs()...)
	attrs = append(attrs, fc.txn.attrs(*fc.exactlyOnce)...)
	attrs = append(attrs, "metadata_max_age", *fc.metadataMaxAge)
	if !fc.share {
		attrs = append(attrs, "group_protocol", fc.protocol.String())
	}
	if *fc.replyTopic != "" {
		attrs = append(attrs, "reply_topic", *fc.replyTopic, "exactly_once", *fc.exactlyOnce)
	}
	if len(fc.regexList) > 0 {
		attrs = append(attrs, "topic_regex", strings.Join(fc.regexList, ","))
	} else {
		attrs = append(attrs, "topics", strings.Join(fc.topicList, ","))
	}
	attrs = append(attrs, fc.optionalAttrs()...)
	attrs = append(attrs, typedAttrs...)
	return append(attrs, h.attrs()...)
}

// optionalAttrs are the start line's fields of the flags that are off by
// default.
func (fc *forwardConfig) optionalAttrs() []any {
	var attrs []any
	if *fc.req.batch > 1 {
		attrs = append(attrs, "batch", *fc.req.batch, "batch_wait", *fc.req.batchWait)
	}
	if *fc.adaptive {
		attrs = append(attrs, "adaptive", true)
	}
	if *fc.req.cloudEvents {
		attrs = append(attrs, "cloudevents", true, "ce_source", *fc.req.ceSource, "ce_type", *fc.req.ceType)
	}
	if *fc.rateLimit > 0 {
		attrs = append(attrs, "rate_limit", *fc.rateLimit, "rate_burst", defaultBurst(*fc.rateLimit, *fc.rateBurst))
	}
	if *fc.keyRateLimit > 0 {
		attrs = append(attrs, "key_rate_limit", *fc.keyRateLimit, "key_rate_burst", defaultBurst(*fc.keyRateLimit, *fc.keyRateBurst))
	}
	if len(fc.retryDelays) > 0 {
		attrs = append(attrs, "retry_topics", *fc.retryTopics)
	}
	if len(fc.req.extra) > 0 {
		// Names only: the values are often credentials.
		attrs = append(attrs, "headers", strings.Join(slices.Sorted(maps.Keys(fc.req.extra)), ","))
	}
	if m := fc.sec.saslMechanism(); m != "" {
		attrs = append(attrs, "sasl", strings.ToLower(m), "sasl_user", fc.sec.user)
	}
	if *fc.metricsListen != "" {
		attrs = append(attrs, "metrics_listen", *fc.metricsListen)
	}
	return attrs
}

// run checks the endpoint and the brokers, consumes until ctx is done,
// and returns the exit code.
func (f *forwarder) run(ctx context.Context) int {
	// A certificate that does not verify fails every request alike: a
	// configuration error to report now, not a reason to dead-letter
	// every record. An endpoint that does not answer yet is waited for.
	if code, ok := checkEndpoint(ctx, f.fs, f.h, *f.att.timeout, f.log); !ok {
		return code
	}
	groupKey, groupName := f.groupAttr()
	// franz-go retries a failing connection forever, which would hide a
	// wrong password or certificate behind a quiet loop: check first, and
	// stop with the reason.
	if err := f.sec.checkBrokers(ctx, f.seeds, connectTimeout, f.reach.clientOpt()); err != nil {
		if ctx.Err() != nil {
			code, _ := f.reach.stoppedEarly(f.seeds, groupKey, groupName) // nothing to drain
			return code
		}
		return f.fail("kpar forward: cannot use the brokers", err)
	}
	if !f.share {
		defer f.reach.watchJoin(ctx, *f.group, f.protocol, *f.sessionTimeout, *f.rebalanceTimeout, *f.instanceID)()
	} else {
		defer f.reach.watchShare(ctx, *f.shareGroup, f.c.ShareStats)() // sharewait.go
	}
	stopLog := context.AfterFunc(ctx, func() {
		if f.share {
			f.log.Info("kpar forward stopping: releasing records not started, finishing in-flight requests", "shutdown_timeout", *f.att.shutdownWait)
			return
		}
		f.log.Info("kpar forward stopping: finishing in-flight requests, then committing", "shutdown_timeout", *f.att.shutdownWait)
	})
	defer stopLog()

	defer f.h.summarize(f.log, routeSummaryInterval, "kpar forward")()
	err := f.c.Run(ctx)
	if ctx.Err() != nil && !f.share {
		if code, early := f.reach.stoppedEarly(f.seeds, groupKey, groupName); early {
			return code
		}
	}
	return f.exit(ctx, err)
}

// fail logs why kpar forward cannot run and returns 1.
func (fc *forwardConfig) fail(msg string, err error) int {
	fc.log.Error(msg, "err", err)
	return 1
}

// exit logs how Run ended (err) and returns the exit code.
func (f *forwarder) exit(ctx context.Context, err error) int {
	if errors.Is(err, kpar.ErrFinalCommit) && ctx.Err() != nil {
		// A requested stop whose last commit failed (a rebalance
		// still waiting for a crashed member, a coordinator gone):
		// nothing is lost, what finished since the last commit that
		// landed is delivered again.
		what := "the final commit failed; records finished since the last commit that landed will be delivered again"
		if f.share {
			what = "the last acknowledgements were not sent; the broker delivers those records again when their locks expire"
		}
		if errors.Is(err, kpar.ErrShutdownTimeout) {
			what = "--shutdown-timeout passed with records unfinished, and " + what
		}
		f.log.Warn("kpar forward stopped: "+what, "err", err)
		return 0
	}
	if errors.Is(err, kpar.ErrShutdownTimeout) && ctx.Err() != nil {
		// A requested stop that could not finish everything in time:
		// nothing is lost, the rest is delivered again after a restart.
		if f.share {
			f.log.Warn("kpar forward stopped: --shutdown-timeout passed with records unfinished; they were released and will be delivered again")
			return 0
		}
		f.log.Warn("kpar forward stopped: --shutdown-timeout passed with records unfinished; offsets committed below them, they will be delivered again")
		return 0
	}
	if err != nil {
		if why := f.sec.explainConnectError(err); why != nil {
			err = why
		}
		return f.fail("kpar forward: stopped", err)
	}
	if f.share {
		st, _ := f.c.ShareStats()
		f.log.Info("kpar forward stopped: in-flight records finished and acknowledged",
			"accepted", st.Accepted, "dead_lettered", st.DeadLettered, "released", st.Released)
		return 0
	}
	f.log.Info("kpar forward stopped: in-flight records finished and offsets committed")
	return 0
}
