// Package kparotel carries OpenTelemetry trace context through kpar: a
// record whose headers hold W3C trace context (traceparent, tracestate)
// is handled with that context in the handler's ctx, so that spans the
// handler starts, and requests it makes with an instrumented client,
// continue the producer's trace even though the record crossed kpar's
// worker pool.
//
//	h := kparotel.Handler(myHandler, kparotel.TracerProvider(tp))
//	c, err := kpar.New(h, opts...)
//
// Without TracerProvider the Handler only extracts: trace.SpanContextFromContext
// (ctx) is the producer's span context, marked remote. With one, each
// attempt is a span of kind consumer, child of the producer's span, named
// "<topic> process" with the messaging attributes of OpenTelemetry's
// semantic conventions for Kafka; a failed attempt records its error and
// an Error status.
//
// It is a module of its own so that kpar's core links no OpenTelemetry.
package kparotel

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kpar/kpar"
)

// ScopeName is the instrumentation scope of the spans Handler starts.
const ScopeName = "github.com/kpar/kpar/kparotel"

// Option configures Handler.
type Option interface{ apply(*cfg) }

type option func(*cfg)

func (o option) apply(c *cfg) { o(c) }

type cfg struct {
	tp         trace.TracerProvider
	propagator propagation.TextMapPropagator
}

// TracerProvider makes Handler start a span per attempt from tp, overriding
// the default of starting none (extraction only).
func TracerProvider(tp trace.TracerProvider) Option {
	return option(func(c *cfg) { c.tp = tp })
}

// Propagator sets how trace context is read from record headers,
// overriding the default propagation.TraceContext{} (W3C traceparent and
// tracestate). Pass otel.GetTextMapPropagator() to use the global one,
// for instance with baggage.
func Propagator(p propagation.TextMapPropagator) Option {
	return option(func(c *cfg) { c.propagator = p })
}

// Handler returns h with each record's trace context in its ctx, and with
// TracerProvider a span around each attempt.
func Handler(h kpar.Handler, opts ...Option) kpar.Handler {
	c := cfg{propagator: propagation.TraceContext{}}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	t := &traced{h: h, propagator: c.propagator}
	if c.tp != nil {
		t.tracer = c.tp.Tracer(ScopeName)
	}
	return t
}

type traced struct {
	h          kpar.Handler
	propagator propagation.TextMapPropagator
	tracer     trace.Tracer // nil: extract only
}

func (t *traced) Handle(ctx context.Context, r *kgo.Record) error {
	ctx = t.propagator.Extract(ctx, Carrier(r))
	if t.tracer == nil {
		return t.h.Handle(ctx, r)
	}
	ctx, span := t.tracer.Start(ctx, r.Topic+" process",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", r.Topic),
			attribute.String("messaging.destination.partition.id", strconv.FormatInt(int64(r.Partition), 10)),
			attribute.Int64("messaging.kafka.offset", r.Offset),
		),
	)
	defer span.End()
	if r.Key != nil {
		span.SetAttributes(attribute.String("messaging.kafka.message.key", string(r.Key)))
	}
	err := t.h.Handle(ctx, r)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.Bool("kpar.permanent", kpar.IsPermanent(err)))
	}
	return err
}

// Carrier is a propagation.TextMapCarrier over r's headers, for
// propagators' Extract and Inject: Get returns the last header of a name
// (names compared exactly, as W3C's lower-case names are sent), Set
// replaces every header of the name with one, Keys lists the names.
func Carrier(r *kgo.Record) propagation.TextMapCarrier { return carrier{r} }

type carrier struct{ r *kgo.Record }

func (c carrier) Get(key string) string {
	for i := len(c.r.Headers) - 1; i >= 0; i-- {
		if c.r.Headers[i].Key == key {
			return string(c.r.Headers[i].Value)
		}
	}
	return ""
}

func (c carrier) Set(key, value string) {
	hs := c.r.Headers[:0:0]
	for _, h := range c.r.Headers {
		if h.Key != key {
			hs = append(hs, h)
		}
	}
	c.r.Headers = append(hs, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c.r.Headers))
	for _, h := range c.r.Headers {
		keys = append(keys, h.Key)
	}
	return keys
}

// Inject writes ctx's trace context into r's headers, for a producer that
// wants its records to carry it (kpar forward sends it on to the endpoint).
func Inject(ctx context.Context, r *kgo.Record, opts ...Option) {
	c := cfg{propagator: propagation.TraceContext{}}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	c.propagator.Inject(ctx, Carrier(r))
}
