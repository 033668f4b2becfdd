package kpar

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The share runner's workers: taking ready records, running attempts, and
// sending failures to a retry or to the dead-letter sink.

func (s *shareRun) worker(ctx context.Context, slot int) {
	var (
		taken, accept []*shareRec
		recs          []*kgo.Record
	)
	for {
		s.mu.Lock()
		for len(s.ready) == 0 && !s.stop {
			s.cond.Wait()
		}
		if s.stop {
			s.mu.Unlock()
			return
		}
		taken = s.takeLocked(taken[:0])
		s.running += len(taken)
		s.mu.Unlock()

		accept = s.attempt(ctx, slot, taken, &recs, accept)
		s.mu.Lock()
		s.running -= len(taken)
		s.mu.Unlock()
		if len(accept) > 0 {
			s.accepted.Add(int64(len(accept)))
			s.settle(accept, kgo.AckAccept)
		}
		clear(taken)
		clear(accept)
		accept = accept[:0]
	}
}

// attempt runs the handler once on rs (one record, or a batch for a
// BatchHandler) with an attempt context the engine's watchdog cancels at
// AttemptTimeout, and returns accept with the records that succeeded
// appended; failed ones go to failed.
func (s *shareRun) attempt(ctx context.Context, slot int, rs []*shareRec, recs *[]*kgo.Record, accept []*shareRec) []*shareRec {
	now := time.Now()
	*recs = (*recs)[:0]
	for _, r := range rs {
		s.eng.dispatched(&r.t, now)
		*recs = append(*recs, r.t.Value.rec)
	}
	actx := &attemptCtx{Context: ctx, deadline: now.Add(s.cfg.attemptTimeout), task: &rs[0].t, attempt: rs[0].t.Value.attempts}
	s.eng.slots[slot].Store(actx)
	var err error
	if s.bh != nil {
		err = s.eng.callBatch(actx, *recs)
	} else {
		err = callHandler(actx, s.h, (*recs)[0])
	}
	s.eng.slots[slot].Store(nil)
	timedOut := err != nil && actx.timedOut()
	for _, r := range rs {
		backoff := s.eng.observe(&r.t, err)
		switch {
		case err == nil:
			accept = append(accept, r)
		case ctx.Err() != nil:
			// Hard stop: the record is released with the rest.
		default:
			s.failed(r, err, timedOut, backoff)
		}
	}
	clear(*recs)
	return accept
}

// takeLocked pops the next ready record and, for a BatchHandler, the
// records that may join it: its key's queued records (ByKey), or the next
// ready records of its partition without a lane. A Handler's worker takes
// one record at a time, as the engine's do, so that a slow record holds
// back no other (nor its acknowledgement). Called with mu held.
func (s *shareRun) takeLocked(batch []*shareRec) []*shareRec {
	first := s.ready[0]
	s.ready[0] = nil
	s.ready = s.ready[1:]
	batch = append(batch, first)
	if s.bh == nil {
		return batch
	}
	fr := first.t.Value.rec
	if ln := first.lane; ln != nil {
		for len(batch) < s.cfg.batchSize && len(ln.queue) > 0 {
			r := ln.queue[0]
			ln.queue = ln.queue[1:]
			r.active = true
			ln.active++
			batch = append(batch, r)
		}
		return batch
	}
	for len(batch) < s.cfg.batchSize && len(s.ready) > 0 {
		r := s.ready[0]
		if r.lane != nil || r.t.Value.rec.Topic != fr.Topic || r.t.Value.rec.Partition != fr.Partition {
			break
		}
		s.ready[0] = nil
		s.ready = s.ready[1:]
		batch = append(batch, r)
	}
	return batch
}

// failed applies the failure policy (nextStep) to a failed attempt: a
// retry after backoff while the record stays acquired, or the dead-letter
// sink. During shutdown a record to retry is released instead, unless it
// is on its last delivery.
func (s *shareRun) failed(r *shareRec, err error, timedOut bool, backoff time.Duration) {
	it := &r.t.Value
	noteFailure(it, err, timedOut, time.Now())
	step := s.cfg.nextStep(it, s.log)
	s.mu.Lock()
	if step == stepDeadLetter {
		s.dead = append(s.dead, r)
		s.mu.Unlock()
		select {
		case s.deadWake <- struct{}{}:
		default:
		}
		return
	}
	if s.closing && !r.last {
		s.mu.Unlock()
		s.settle([]*shareRec{r}, kgo.AckRelease)
		return
	}
	if step == stepRetryCapped {
		backoff = s.cfg.retryMax
	}
	if !s.stop {
		s.timers[r] = time.AfterFunc(backoff, func() {
			s.mu.Lock()
			if _, ok := s.timers[r]; !ok || s.stop {
				s.mu.Unlock()
				return
			}
			delete(s.timers, r)
			if s.closing && !r.last {
				s.mu.Unlock()
				s.settle([]*shareRec{r}, kgo.AckRelease)
				return
			}
			s.ready = append(s.ready, r)
			s.cond.Signal()
			s.mu.Unlock()
		})
	}
	s.mu.Unlock()
}

// deadLetterWriter writes failed records to the sink in batches and
// accepts them once the sink acknowledged them. Until then they stay
// acquired and unacknowledged. It runs until ctx (the hard stop) ends.
func (s *shareRun) deadLetterWriter(ctx context.Context) {
	writeQueued(ctx, s.deadWake, &s.mu, &s.dead, func(batch []*shareRec) bool {
		ts := tasksOf(batch, func(r *shareRec) *task { return &r.t })
		if !s.eng.deadLetterUntilAcked(ctx, ts, "the records stay acquired, unacknowledged, until it succeeds") {
			return false
		}
		s.deadLettered.Add(int64(len(batch)))
		s.accepted.Add(int64(len(batch)))
		s.settle(batch, kgo.AckAccept)
		return true
	})
}
