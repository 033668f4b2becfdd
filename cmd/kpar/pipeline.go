package main

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/forward"
)

// pipelineFlags are the flags kpar forward and kpar backfill share: the
// brokers, the endpoint and its requests (--url, --route, the request
// flags, the typed flags), the attempts, the memory bound, the dead-letter
// sink, the security flags and the log level. Both commands read, check
// and turn them into options here, so that each rule lives once.
type pipelineFlags struct {
	fs                                               *flagSet
	brokers, target, deadLetters, dlqTopic, logLevel *string
	req                                              *requestFlags
	routes                                           *routeFlags
	att                                              attemptFlags
	limits                                           *limitFlags
	sec                                              *securityOpts
	typed                                            *typedFlags

	// Set by check.
	seeds []string
	log   *slog.Logger
	sink  deadLetterSink
}

// pipelineHelp is what the shared flags' help says differently per
// command.
type pipelineHelp struct {
	maxAttempts, deadLetters, dlqTopic string
	replies                            bool // the typed flags include --reply-schema
}

// addPipelineFlags defines the shared flags on fs.
func addPipelineFlags(fs *flagSet, help pipelineHelp) pipelineFlags {
	return pipelineFlags{
		fs:          fs,
		brokers:     fs.String("brokers", "", "comma-separated seed brokers `host:port,...` (required)"),
		target:      fs.String("url", "", "http or https `URL` to POST every record to (required unless --route is given; with --route, the records no route matches)"),
		req:         addRequestFlags(fs),
		routes:      addRouteFlags(fs), // --filter, --route: route.go
		att:         addAttemptFlags(fs, help.maxAttempts),
		limits:      addLimitFlags(fs), // forward_limits.go
		deadLetters: fs.String("dead-letters", "", help.deadLetters),
		dlqTopic:    fs.String("dlq-topic", "", help.dlqTopic),
		logLevel:    addLogLevel(fs),
		sec:         securityFlags(fs),
		typed:       addTypedFlags(fs, help.replies), // typed.go
	}
}

// checkTarget is the usage error of neither --url nor --route.
func (p *pipelineFlags) checkTarget() (code int, ok bool) {
	return p.routes.checkTarget(p.fs, *p.target)
}

// check reads the shared flags: the brokers, the request, attempt and
// memory flags, the log level and the dead-letter sink (whose --dlq-topic
// each command checks against its own topics).
func (p *pipelineFlags) check() (code int, ok bool) {
	fs := p.fs
	seeds, err := splitBrokers(*p.brokers)
	if err != nil {
		return fs.usageError("invalid --brokers: %v", err), false
	}
	p.seeds = seeds
	for _, check := range []func(*flagSet) (int, bool){p.req.check, p.att.check, p.limits.check} {
		if code, ok := check(fs); !ok {
			return code, false
		}
	}
	if p.log, code, ok = fs.logger(*p.logLevel); !ok {
		return code, false
	}
	if p.sink, err = parseDeadLetters(*p.deadLetters); err != nil {
		return fs.usageError("invalid --dead-letters: %v", err), false
	}
	if *p.dlqTopic != "" && p.sink.scheme != "kafka" {
		return fs.usageError("invalid --dlq-topic: it names a Kafka topic, and --dead-letters is %s://", p.sink.scheme), false
	}
	if p.sink.topic == "" {
		p.sink.topic = *p.dlqTopic
	}
	return 0, true
}

// endpoints makes what records are sent to: the request flags' forward
// options after base, the typed flags' (which decode for the routes'
// expressions too), and the handlers of --url and --route; with the
// client options of the security flags and the typed flags' start-line
// attributes.
func (p *pipelineFlags) endpoints(ctx context.Context, replyTopic string, base ...forward.Opt) (h *endpoints, secOpts []kgo.Opt, typedAttrs []any, code int, ok bool) {
	fwdOpts, code, ok := p.req.opts(p.fs, base...)
	if !ok {
		return nil, nil, nil, code, false
	}
	typedOpts, typedAttrs, code, ok := p.typed.opts(ctx, p.fs, p.log, replyTopic)
	if !ok {
		return nil, nil, nil, code, false
	}
	fwdOpts = append(fwdOpts, typedOpts...)
	p.routes.decoder = p.typed.decoder // the expressions read the decoded record
	h, secOpts, code, ok = p.routes.endpoints(p.fs, *p.target, *p.req.contentType, p.sec, fwdOpts...)
	if !ok {
		return nil, nil, nil, code, false
	}
	return h, secOpts, typedAttrs, 0, true
}

// warnPlainText warns of a password sent in clear text.
func (p *pipelineFlags) warnPlainText() {
	if p.sec.plainTextPassword() {
		p.log.Warn("SASL PLAIN without TLS sends the password in clear text; add --tls or --tls-ca")
	}
}
