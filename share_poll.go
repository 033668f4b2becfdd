package kpar

import (
	"context"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The share runner's poller: polling, making records ready, and renewing
// the acquisition locks of the records it holds.

// poll fetches records until ctx ends or a fatal error. It polls again only
// once every record of the last poll has its final acknowledgement: the
// client would accept the others at the next poll.
func (s *shareRun) poll(ctx context.Context) error {
	flog := &fetchErrorLog{log: s.log}
	for {
		if !s.waitAcknowledged(ctx) {
			return nil
		}
		fs := s.cl.PollRecords(ctx, s.maxPoll)
		if fs.IsClientClosed() {
			return nil
		}
		if err := fatalFetchError(fs, flog, "share group: "); err != nil {
			s.push(fs)
			return err
		}
		s.push(fs)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// push makes the records of one poll ready (or queues them behind their
// key).
func (s *shareRun) push(fs kgo.Fetches) {
	now := time.Now()
	n := 0
	limit := s.limit.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	fs.EachRecord(func(r *kgo.Record) {
		n++
		rec := &shareRec{}
		rec.t.Value.rec = r
		dc := r.DeliveryCount()
		if dc > 1 {
			s.redelivered.Add(1)
		}
		if dc > s.maxDelivery.Load() {
			s.maxDelivery.Store(dc) // only push writes it
		}
		rec.last = limit > 0 && dc >= limit
		// The time left on the lock stands for its duration: the first
		// renewal comes early rather than late.
		rec.lockLen = max(r.AcquisitionDeadline().Sub(now), 20*time.Millisecond)
		rec.renewAt = now.Add(rec.lockLen / 2)
		s.held[rec] = struct{}{}
		s.topics[r.Topic] = struct{}{}
		if s.cfg.ordering == ByKey && r.Key != nil {
			k := r.Topic + "\x00" + string(r.Key)
			ln := s.lanes[k]
			if ln == nil {
				ln = &shareLane{key: k}
				s.lanes[k] = ln
			}
			rec.lane = ln
			if ln.active > 0 {
				ln.queue = append(ln.queue, rec)
				return
			}
			ln.active++
			rec.active = true
		}
		s.ready = append(s.ready, rec)
	})
	if n == 0 {
		return
	}
	s.polls.Add(1)
	s.received.Add(int64(n))
	if s.empty == nil && len(s.held) > 0 {
		s.empty = make(chan struct{})
	}
	s.cond.Broadcast()
}

// waitAcknowledged waits until every held record has its final
// acknowledgement, renewing the locks of the others meanwhile. It reports
// false when ctx ended first.
func (s *shareRun) waitAcknowledged(ctx context.Context) bool {
	s.mu.Lock()
	ch := s.empty
	tick := time.Second
	for r := range s.held {
		tick = min(tick, r.lockLen/4)
	}
	s.mu.Unlock()
	if ch == nil {
		return ctx.Err() == nil
	}
	t := time.NewTicker(max(tick, 5*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ch:
			return ctx.Err() == nil
		case <-ctx.Done():
			return false
		case now := <-t.C:
			s.renew(ctx, now)
		}
	}
}

// renew extends the acquisition locks that passed half their duration.
func (s *shareRun) renew(ctx context.Context, now time.Time) {
	var due []*kgo.Record
	lock := time.Duration(math.MaxInt64)
	s.mu.Lock()
	for r := range s.held {
		if !now.Before(r.renewAt) {
			r.renewAt = now.Add(r.lockLen / 2)
			due = append(due, r.t.Value.rec)
			lock = min(lock, r.lockLen)
		}
	}
	s.mu.Unlock()
	if len(due) == 0 {
		return
	}
	// A record acknowledged meanwhile keeps its final status: the client
	// renews only records with none.
	s.cl.MarkAcks(kgo.AckRenew, due...)
	s.renewed.Add(int64(len(due)))
	// The client sends acknowledgements with its next fetch, or after a
	// second: too late for a short lock. Send them now (the poller has
	// nothing else to do meanwhile).
	fctx, cancel := context.WithTimeout(ctx, min(lock/4, time.Second))
	_ = s.cl.FlushAcks(fctx)
	cancel()
}
