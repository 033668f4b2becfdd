package kpar

import (
	"context"
	"errors"
	"fmt"

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
// ClientOptions (TLS, SASL). A failed produce fails the attempt as an
// Overloaded error, so that it burns no attempt and the handler runs again.
// Default: off (Emit returns ErrNoOutputs).
func Outputs() FlowOpt { return flowOpt(func(c *cfg) { c.outputs = true }) }

// outputs produces what handlers emit. The client is set by the source's
// open; read-only afterwards.
type outputs struct {
	cl     *kgo.Client
	eos    bool // ExactlyOnce: the group source's transactions produce them
	limits topicLimits
}

// newOutputs makes the producer of outputs: transactional with
// ExactlyOnce.
func newOutputs(c *cfg) (*outputs, error) {
	opts := []kgo.Opt{kgo.WithLogger(kgoLogger{L: c.logger})}
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
	return &outputs{cl: cl, eos: c.exactlyOnce}, nil
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
// once, it keeps them with t for the transaction that commits t. Called
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
