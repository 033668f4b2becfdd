package kparotel_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/kparotel"
)

const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	spanID      = "00f067aa0ba902b7"
	traceparent = "00-" + traceID + "-" + spanID + "-01"
)

func tracedRecord() *kgo.Record {
	return &kgo.Record{Topic: "orders", Partition: 2, Offset: 9, Key: []byte("k"), Headers: []kgo.RecordHeader{
		{Key: "other", Value: []byte("x")},
		{Key: "traceparent", Value: []byte(traceparent)},
		{Key: "tracestate", Value: []byte("congo=t61rcWkgMzE")},
	}}
}

func TestHandlerPutsTheRecordsTraceContextInTheContext(t *testing.T) {
	var got trace.SpanContext
	h := kparotel.Handler(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		got = trace.SpanContextFromContext(ctx)
		return nil
	}))
	if err := h.Handle(context.Background(), tracedRecord()); err != nil {
		t.Fatal(err)
	}
	if got.TraceID().String() != traceID || got.SpanID().String() != spanID || !got.IsRemote() || !got.IsSampled() {
		t.Errorf("span context %v, want the record's, remote and sampled", got)
	}
	if ts := got.TraceState().String(); ts != "congo=t61rcWkgMzE" {
		t.Errorf("tracestate %q", ts)
	}
}

func TestHandlerWithoutTraceContextLeavesTheContextAlone(t *testing.T) {
	h := kparotel.Handler(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			t.Errorf("span context %v for a record without one", sc)
		}
		return nil
	}))
	_ = h.Handle(context.Background(), &kgo.Record{Topic: "t", Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("garbage")}}})
}

func TestHandlerStartsASpanPerAttempt(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())
	fail := errors.New("endpoint down")
	calls := 0
	h := kparotel.Handler(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		calls++
		if sc := trace.SpanContextFromContext(ctx); sc.TraceID().String() != traceID || sc.IsRemote() {
			t.Errorf("handler's span context %v, want a local span of trace %s", sc, traceID)
		}
		if calls == 1 {
			return fail
		}
		return nil
	}), kparotel.TracerProvider(tp))
	r := tracedRecord()
	if err := h.Handle(context.Background(), r); !errors.Is(err, fail) {
		t.Fatalf("first attempt: %v, want the handler's error", err)
	}
	if err := h.Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	spans := sr.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want one per attempt", len(spans))
	}
	for i, s := range spans {
		if s.Name() != "orders process" || s.SpanKind() != trace.SpanKindConsumer ||
			s.Parent().SpanID().String() != spanID || s.SpanContext().TraceID().String() != traceID {
			t.Errorf("span %d: %q kind %v parent %v", i, s.Name(), s.SpanKind(), s.Parent())
		}
	}
	if spans[0].Status().Code != codes.Error || spans[1].Status().Code == codes.Error {
		t.Errorf("statuses %v, %v: want the failed attempt marked", spans[0].Status(), spans[1].Status())
	}
}

func TestCarrierAndInjectRoundTrip(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "produce")
	defer span.End()
	r := tracedRecord() // an old traceparent, replaced
	kparotel.Inject(ctx, r)
	n := 0
	for _, h := range r.Headers {
		if h.Key == "traceparent" {
			n++
		}
	}
	c := kparotel.Carrier(r)
	if n != 1 || c.Get("traceparent") != "00-"+span.SpanContext().TraceID().String()+"-"+span.SpanContext().SpanID().String()+"-01" {
		t.Errorf("headers %q after Inject, want one traceparent of the new span", r.Headers)
	}
	if c.Get("other") != "x" || len(c.Keys()) != len(r.Headers) {
		t.Errorf("other header lost: %q", r.Headers)
	}
}

// TestHandlerCarriesTraceContextThroughKpar produces a record with Inject
// and consumes it with kpar on kfake: the handler, run by kpar's worker
// pool, sees the producer's trace.
func TestHandlerCarriesTraceContextThroughKpar(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	pctx, span := tp.Tracer("producer").Start(ctx, "produce")
	r := &kgo.Record{Topic: "orders", Value: []byte("v")}
	kparotel.Inject(pctx, r)
	span.End()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}

	got := make(chan trace.SpanContext, 1)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	h := kparotel.Handler(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
		got <- trace.SpanContextFromContext(ctx)
		return nil
	}))
	cons, err := kpar.New(h, kpar.Brokers(c.ListenAddrs()...), kpar.Group("g"), kpar.Topics("orders"),
		kpar.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- cons.Run(runCtx) }()
	select {
	case sc := <-got:
		if sc.TraceID() != span.SpanContext().TraceID() {
			t.Errorf("handler saw trace %v, want the producer's %v", sc.TraceID(), span.SpanContext().TraceID())
		}
	case err := <-ran:
		t.Fatalf("Run returned: %v", err)
	case <-ctx.Done():
		t.Fatal("the record never reached the handler")
	}
	stop()
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
}
