package kpar

import (
	"context"
	"errors"
	"time"

	"github.com/kpar/kpar/deadletter"
)

// classify names why the last attempt of a record failed.
func classify(err error, timedOut bool) deadletter.Class {
	var pe *PanicError
	switch {
	case IsPermanent(err):
		return deadletter.ClassPermanent
	case timedOut:
		return deadletter.ClassTimeout
	case errors.As(err, &pe):
		return deadletter.ClassPanic
	}
	return deadletter.ClassExhausted
}

// failStep is where a failed attempt sends its record; see nextStep.
type failStep uint8

const (
	stepRetry       failStep = iota // another local attempt after the backoff
	stepRetryTopic                  // the next retry topic
	stepDeadLetter                  // the dead-letter sink
	stepRetryCapped                 // no sink: retried at the backoff cap until it succeeds
)

// noteFailure records a failed attempt in the record's failure history
// and returns that history. Every consuming mode (engine, backfill, share
// group) calls it first.
func noteFailure(it *item, err error, timedOut bool, now time.Time) *extra {
	x := it.ext()
	if x.firstFailure.IsZero() {
		x.firstFailure = now
	}
	x.lastFailure, x.lastErr = now, err
	x.class = classify(err, timedOut)
	return x
}

// localAttempts is how many attempts a record gets here before it moves
// on: MaxAttempts, or one for a record from a retry topic, which is itself
// a delayed retry.
func (c *cfg) localAttempts(it *item) int {
	if it.level() > 0 {
		return 1
	}
	return c.maxAttempts
}

// nextStep decides where a record goes after a failed attempt noted by
// noteFailure: another local attempt while MaxAttempts allows (one per
// retry-topic level), then the next retry topic, then the dead-letter sink;
// a Permanent error skips both retries. Without a sink the record is
// retried at the backoff cap (observe logs it once): it is never skipped.
// It is the failure policy of every source.
func (c *cfg) nextStep(it *item) failStep {
	x := it.x
	allowed := c.localAttempts(it)
	switch {
	case x.class != deadletter.ClassPermanent && it.attempts < allowed:
		return stepRetry
	case x.class != deadletter.ClassPermanent && x.level < len(c.retryTopics):
		return stepRetryTopic
	case c.deadLetters != nil:
		return stepDeadLetter
	}
	return stepRetryCapped
}

// nowhereToGo reports whether the failed attempt err of it, running now,
// leaves the record nowhere durable to go (no retry topic left, no
// dead-letter sink) for the first time, so that observe logs it once. It
// reads it.x, which only the record's worker writes while it runs.
func (c *cfg) nowhereToGo(it *item, err error) bool {
	if c.deadLetters != nil || IsOverloaded(err) {
		return false
	}
	if IsPermanent(err) {
		return it.x == nil || it.x.class != deadletter.ClassPermanent
	}
	return it.attempts == c.localAttempts(it) && it.level() >= len(c.retryTopics)
}

// fail handles a failed attempt: retry locally after backoff, or, once the
// attempts are used up (or at once for Permanent), hand the record to the
// exile writer: the next retry topic, else the dead-letter sink (see
// nextStep). Called with mu held.
func (e *engine) fail(t *task, err error, timedOut bool, backoff time.Duration, now time.Time) {
	it := &t.Value
	x := noteFailure(it, err, timedOut, now)
	dead, wait := e.hung(it, x, err, timedOut, backoff)
	if dead {
		e.exile(t) // to the dead letters (toDeadLetters)
		return
	}
	backoff = max(backoff, wait)
	if IsOverloaded(err) && x.class != deadletter.ClassPermanent {
		// The downstream pushed back: the adaptive limit (or, without it,
		// the overload breaker) paces the retries, and the attempt does
		// not count. The record waits for the downstream, it is not
		// dead-lettered for its overload.
		it.attempts--
		e.retryLater(t, backoff)
		return
	}
	switch e.cfg.nextStep(it) {
	case stepRetry:
		e.retryLater(t, backoff)
	case stepRetryTopic, stepDeadLetter:
		e.exile(t)
	case stepRetryCapped:
		e.retryLater(t, e.cfg.retryMax)
	}
}

// exile queues a record for the exile writer. The record keeps its lane
// and stays unfinished until the write is acknowledged. Called with mu held.
func (e *engine) exile(t *task) {
	e.retries.Exile(t)
	select {
	case e.exileWake <- struct{}{}:
	default:
	}
}

// exileWriter moves exiled records to their next retry topic or to the
// dead-letter sink, in batches, retrying failed writes with backoff. A
// record is finished only after its write was acknowledged. It runs until
// ctx ends (the hard stop): during a graceful drain it keeps writing.
func (e *engine) exileWriter(ctx context.Context) {
	take := func() []*task {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.retries.TakeExiled()
	}
	writeQueued(ctx, e.exileWake, take, func(batch []*task) bool {
		return e.writeExiled(ctx, batch)
	})
}

// writeQueued is the loop of a writer goroutine (the exile writer). At
// each wake it takes the whole queue (take, which takes the lock guarding
// it) and writes it, until the queue stays empty. It returns when ctx ends
// or write returns false (ctx ended before the write succeeded).
func writeQueued[T any](ctx context.Context, wake <-chan struct{}, take func() []T, write func(batch []T) bool) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		}
		for {
			batch := take()
			if len(batch) == 0 {
				break
			}
			if !write(batch) {
				return
			}
		}
	}
}

// writeExiled writes one batch until it succeeds or ctx ends, then finishes
// its records. Records of partitions revoked meanwhile are skipped: their
// new owner handles them again.
func (e *engine) writeExiled(ctx context.Context, batch []*task) bool {
	var toRetry, toDead []*task
	for _, t := range batch {
		if t.Value.x.toDeadLetters(e.retryTo.Levels()) {
			toDead = append(toDead, t)
		} else {
			toRetry = append(toRetry, t)
		}
	}
	for attempt := 1; ; attempt++ {
		refused, err := e.writeRetries(ctx, toRetry)
		if err == nil {
			toRetry = nil
			// Retrying cannot make them fit: the dead-letter sink
			// writes what it can of them (a Kafka sink cuts them).
			toDead = append(toDead, refused...)
			err = e.writeDeadLetters(ctx, toDead)
		}
		if err == nil {
			break
		}
		wait := e.retryTo.SinkBackoff(attempt)
		e.log.Error("kpar: writing failed records to the retry topic or dead-letter sink failed; their offsets stay uncommitted until it succeeds",
			"records", len(toRetry)+len(toDead), "attempt", attempt, "retry_in", wait, "err", err)
		for _, h := range e.hooks.deadLetterFailed {
			h.OnDeadLetterFailed(len(toRetry)+len(toDead), err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
	e.mu.Lock()
	handedOver := 0
	for _, t := range batch {
		if t.Value.part.status == dropped {
			continue
		}
		if t.Value.x.toDeadLetters(e.retryTo.Levels()) {
			e.outcomes.DeadLettered()
		}
		e.hangs.exiledDone++
		if next := e.complete(t); next != nil {
			e.ready.Push(next)
			handedOver++
		}
	}
	e.wake(handedOver)
	e.mu.Unlock()
	return true
}

// toDeadLetters reports whether an exiled record goes to the dead-letter
// sink rather than to its next retry topic (levels of them): it failed for
// good, it used the last retry topic, or that topic refused it as too
// large.
func (x *extra) toDeadLetters(levels int) bool {
	return x.class == deadletter.ClassPermanent || x.level >= levels || x.retryRefused || x.hung
}

// letter is the dead letter of the record of it, from its failure
// history, for the consumer group (or share group) group.
func (it *item) letter(group string) deadletter.Letter {
	x := it.ext()
	msg := ""
	if x.lastErr != nil {
		msg = x.lastErr.Error()
		var pe *PanicError
		if errors.As(x.lastErr, &pe) {
			msg += "\n" + string(pe.Stack)
		}
	}
	return deadletter.Letter{
		Record:       it.original(),
		Group:        group,
		Class:        x.class,
		Message:      msg,
		Attempts:     it.totalAttempts(),
		FirstFailure: x.firstFailure,
		LastFailure:  x.lastFailure,
	}
}

func (e *engine) writeDeadLetters(ctx context.Context, ts []*task) error {
	if len(ts) == 0 {
		return nil
	}
	letters := make([]deadletter.Letter, len(ts))
	for i, t := range ts {
		letters[i] = t.Value.letter(e.cfg.letterGroup())
	}
	if e.out != nil && e.out.eos {
		// They join the transaction that commits their records
		// (validateOutputs made sure the sink writes to Kafka).
		recs, err := e.cfg.deadLetters.(*deadletter.KafkaSink).Records(ctx, letters)
		if err != nil {
			return err
		}
		for i, t := range ts {
			x := t.Value.x
			x.outputs, x.outKind, x.outLetter = append(x.outputs, recs[i]), outDeadLetter, &letters[i]
		}
	} else if err := e.cfg.deadLetters.Write(ctx, letters); err != nil {
		return err
	}
	for _, l := range letters {
		e.log.Warn("kpar: record dead-lettered", "topic", l.Record.Topic, "partition", l.Record.Partition,
			"offset", l.Record.Offset, "class", l.Class, "attempts", l.Attempts, "err", l.Message)
		for _, h := range e.hooks.deadLettered {
			h.OnDeadLettered(l)
		}
	}
	return nil
}

// retryLater re-queues a failed record after backoff. The record keeps its
// lane meanwhile, so later records of its key (or partition) wait for it;
// other lanes go on. Called with mu held.
func (e *engine) retryLater(t *task, backoff time.Duration) {
	// A record waiting on a timer leaves the shared byte budget: however
	// many records wait for retries, healthy partitions keep being fetched.
	// Each partition's window still bounds its waiting records.
	ps, size := t.Value.part, t.Value.size
	e.buf.Park(&ps.buf, size)
	e.budgetFreed()
	e.retries.Wait(t, time.AfterFunc(backoff, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.stop || !e.retries.Due(t) {
			return
		}
		if ps.status == revoking || ps.status == dropped {
			return // its partition's next owner handles it
		}
		e.retryNow(t)
		e.wake(1)
	}))
}

// stopRetry stops the timer of a record that Forget took out of the
// retries.
func stopRetry(_ *task, tm *time.Timer) { tm.Stop() }

// retryNow makes a record that waited on a retry timer, stopped and
// forgotten by the caller, ready again. Called with mu held.
func (e *engine) retryNow(t *task) {
	e.buf.Unpark(&t.Value.part.buf, t.Value.size)
	e.ready.Push(t)
}
