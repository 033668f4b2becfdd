package kpar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Outputs. A handler that produces records (an enrichment, a service's
// answer) hands them to kpar with Emit, and kpar produces them with the
// record's completion, so that a record counts as finished only with its
// outputs:
//
//   - at least once (Outputs): the outputs are acknowledged by the broker
//     (acks=all, idempotent producer) before their input counts as
//     finished. A crash can repeat them with their input, never lose them.
//   - exactly once (ExactlyOnce): the outputs of the records a commit marks
//     finished go in one Kafka transaction with that commit (txn.go), so a
//     read_committed reader sees each input's outputs exactly once.
//
// Emit and not a return value: the Handler and BatchHandler signatures
// stay as they are, a handler may emit from any depth of its code (kpar
// forward's handler emits the endpoint's reply), and a batch's outputs
// belong to the batch as its records do.

// ErrNoOutputs is returned by Emit when ctx is not a handler's context of a
// Consumer (or Backfill) configured with Outputs or ExactlyOnce.
var ErrNoOutputs = errors.New("kpar: Emit needs the context a handler was given, by a consumer configured with Outputs or ExactlyOnce")

// attemptKey finds an attempt's context among a handler's contexts.
type attemptKey struct{}

// Emit adds records to the outputs of the record (or batch) whose handler
// ctx was given to: kpar produces them with the record's completion (see
// Outputs and ExactlyOnce), in the order emitted. A record's Topic must be
// set; its partition is chosen by the producer from its key, as franz-go's
// default partitioner does. Emit must be called before the handler
// returns; the outputs of an attempt that fails are dropped, and a retry
// emits again. It is safe for concurrent use by the goroutines of one
// attempt.
func Emit(ctx context.Context, rs ...*kgo.Record) error {
	a, _ := ctx.Value(attemptKey{}).(*attemptCtx)
	if a == nil || !a.emit {
		return ErrNoOutputs
	}
	for _, r := range rs {
		if r == nil || r.Topic == "" {
			return errors.New("kpar: Emit: a record without a topic: set Record.Topic")
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err // the attempt was cancelled: its outputs are not taken
	}
	a.outputs = append(a.outputs, rs...)
	return nil
}

// takeOutputs returns, and forgets, what the attempt emitted since the last
// call: a shared attempt context serves several records in turn.
func (c *attemptCtx) takeOutputs() []*kgo.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.outputs
	c.outputs = nil
	return out
}

// Outputs lets handlers emit output records (Emit), produced at least once:
// acknowledged by the broker before their input counts as finished. kpar
// produces them through a client of its own, built from Brokers and
// ClientOptions (TLS, SASL). The worker does not wait for the
// acknowledgements: it hands the outputs to the producer and runs the next
// record, and the input finishes (its lane's next record may run, its
// offset may be committed) once the last of its outputs is acknowledged.
// The outputs waiting for acknowledgements are bounded by MaxBufferedBytes
// (at least 2 MiB), apart from the records' own budget.
// A failed produce fails the attempt as an Overloaded error, so that it
// burns no attempt and the handler runs again; an output alone larger than
// its topic's max.message.bytes fails it as Permanent (toolarge.go).
// Default: off (Emit returns ErrNoOutputs).
func Outputs() FlowOpt { return flowOpt(func(c *cfg) { c.outputs = true }) }

// outputs produces what handlers emit.
type outputs struct {
	// cl is the producer. At least once, it is set by newOutputs and
	// read-only afterwards. With ExactlyOnce, renew replaces it when its
	// producer ID is failed for good (txnrenew.go); renew and every use
	// of it after the source opened hold groupSource.commitMu.
	cl     *kgo.Client
	cfg    *cfg // what renew builds the next client from
	eos    bool // ExactlyOnce: the group source's transactions produce them
	limits topicLimits
	// judging is the goroutines that judge failed produces (outputFailed
	// may ask the broker, which the producer's goroutine must not wait
	// for); close waits for them.
	judging sync.WaitGroup
}

// close closes the client, which fails what it still holds, and waits for
// the failures to be handled.
func (o *outputs) close() {
	o.cl.Close()
	o.judging.Wait()
}

// newOutputs makes the producer of outputs: transactional with
// ExactlyOnce.
func newOutputs(c *cfg) (*outputs, error) {
	cl, err := newOutputsClient(c)
	if err != nil {
		return nil, err
	}
	return &outputs{cl: cl, cfg: c, eos: c.exactlyOnce}, nil
}

// newOutputsClient makes the client of newOutputs.
func newOutputsClient(c *cfg) (*kgo.Client, error) {
	opts := []kgo.Opt{kgo.WithLogger(kgoLogger(c.logger))}
	if !c.exactlyOnce {
		// An input holds its lane until its outputs are acknowledged:
		// lingering (franz-go's default 10ms) would add to every key's
		// turn. Without it the producer still batches what comes while a
		// request is in flight. ClientOptions may set it again.
		opts = append(opts, kgo.ProducerLinger(0))
		// Workers no longer wait for the produce, so the outputs in
		// flight are bounded apart: by MaxBufferedBytes too (at least
		// 2 MiB, so that a record the broker could take is never refused
		// here), past which Produce blocks the worker.
		opts = append(opts, kgo.MaxBufferedBytes(int(max(c.maxBytes, 2<<20))))
	}
	opts = append(opts, c.clientOpts...)
	if len(c.brokers) > 0 {
		opts = append(opts, kgo.SeedBrokers(c.brokers...))
	}
	if c.exactlyOnce {
		opts = append(opts, kgo.TransactionalID(c.txnID()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kpar: creating the client of the outputs: %w", err)
	}
	return cl, nil
}

// produceOutputs produces rs and waits for every acknowledgement. It
// returns the error of the first that failed (see outputFailed), a
// Permanent one first.
func (e *engine) produceOutputs(ctx context.Context, rs []*kgo.Record) error {
	var first error
	for _, r := range e.out.cl.ProduceSync(ctx, rs...) {
		if r.Err == nil {
			continue
		}
		if err := e.outputFailed(ctx, r.Record, r.Err); first == nil || IsPermanent(err) && !IsPermanent(first) {
			first = err
		}
	}
	return first
}

// emitted handles what the attempt of t emitted, once it succeeded: at
// least once, it produces them now and returns the error of that; exactly
// once, it keeps them with t for the transaction that commits t. A batch's
// outputs take this way; a single record's take handOver's. Called
// without mu, by the worker running t.
func (e *engine) emitted(ctx context.Context, t *task, actx *attemptCtx, err error) error {
	outs := actx.takeOutputs()
	if err != nil || len(outs) == 0 {
		return err
	}
	if e.out.eos {
		// Only t's worker touches t while it runs.
		x := t.Value.ext()
		x.outputs = append(x.outputs, outs...)
		return nil
	}
	return e.produceOutputs(ctx, outs)
}

// errOutputsInFlight is what attempt returns for a record whose handler
// succeeded and whose outputs went to the producer: their acknowledgement
// finishes the record (outputsDone), not its worker.
var errOutputsInFlight = errors.New("kpar: the record's outputs are in flight")

// handOver handles what the attempt of t, started at at, emitted: exactly
// once, or with nothing emitted, as emitted does; at least once, it hands
// the outputs to the producer and returns errOutputsInFlight, and the last
// acknowledgement finishes t. Until then t holds its lane (the next record
// of its key or partition waits, as it would for the produce), its window
// slot (its offset is not committed) and its place among the running
// records (a revoke or a drain waits for it), so the order and the
// at-least-once promise are those of a worker that waited; only the
// worker is free. Called without mu, by the worker running t (never for a
// record run: runs are off with outputs).
func (e *engine) handOver(ctx context.Context, t *task, actx *attemptCtx, at time.Time, err error) error {
	if err != nil || e.out.eos {
		return e.emitted(ctx, t, actx, err)
	}
	outs := actx.takeOutputs()
	if len(outs) == 0 {
		return nil
	}
	f := &inFlight{e: e, ctx: ctx, t: t, at: at}
	f.left.Store(int32(len(outs)))
	for _, r := range outs {
		e.out.cl.Produce(ctx, r, f.acked)
	}
	return errOutputsInFlight
}

// inFlight is a record whose outputs the producer holds.
type inFlight struct {
	e    *engine
	ctx  context.Context // the produce's
	t    *task
	at   time.Time // its attempt's start
	left atomic.Int32
	mu   sync.Mutex // guards failed and err
	// failed is the output whose produce failed first (one refused as too
	// large before any other), err its error.
	failed *kgo.Record
	err    error
}

// acked is the producer's promise for each output of f. An output refused
// as too large is judged apart (the judgement may ask the broker, which
// the producer's goroutine must not wait for): refused for its batch, it
// is produced again, alone the next time as far as the producer allows.
func (f *inFlight) acked(r *kgo.Record, err error) {
	e := f.e
	switch {
	case err == nil:
	case isTooLarge(err):
		e.out.judging.Go(func() {
			if !e.out.guilty(context.Background(), r) {
				e.warnBatchTooLarge(r.Topic, err)
				again := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}
				e.out.cl.Produce(f.ctx, again, f.acked)
				return
			}
			f.fail(r, err)
			f.done()
		})
		return
	default:
		f.fail(r, err)
	}
	f.done()
}

// fail notes that output r failed with err.
func (f *inFlight) fail(r *kgo.Record, err error) {
	f.mu.Lock()
	if f.err == nil || isTooLarge(err) && !isTooLarge(f.err) {
		f.failed, f.err = r, err
	}
	f.mu.Unlock()
}

// done counts one output of f answered, and finishes f's record after the
// last.
func (f *inFlight) done() {
	if f.left.Add(-1) > 0 {
		return
	}
	f.mu.Lock()
	failed, err := f.failed, f.err
	f.mu.Unlock()
	if err != nil {
		err = f.e.outputFailed(context.Background(), failed, err)
	}
	f.e.outputsDone(f.t, f.at, err)
}

// outputsDone finishes t, whose outputs were all acknowledged (err nil) or
// one of which failed: as its worker would have, had it waited.
func (e *engine) outputsDone(t *task, at time.Time, err error) {
	backoff := e.observe(t, err)
	e.mu.Lock()
	if next := e.finish(t, err, false, backoff, at); next != nil {
		e.ready.Push(next)
		e.wake(1)
	}
	e.mu.Unlock()
}
