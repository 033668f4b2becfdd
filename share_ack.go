package kpar

import (
	"github.com/twmb/franz-go/pkg/kgo"
)

// The share runner's acknowledgements: settling records with the broker
// (ACCEPT, RELEASE), handing a key's turn on, and the client's ack results.

// unstartedLocked takes the records that have not started (ready, queued
// behind their key, waiting for a retry) out of the pipeline for release,
// except those on their last delivery. Called with mu held.
func (s *shareRun) unstartedLocked() []*shareRec {
	var out []*shareRec
	s.ready, out = keepLast(s.ready, out)
	for _, ln := range s.lanes {
		ln.queue, out = keepLast(ln.queue, out)
	}
	for r, tm := range s.timers {
		if !r.last {
			tm.Stop()
			delete(s.timers, r)
			out = append(out, r)
		}
	}
	return out
}

// keepLast filters rs in place down to the records on their last delivery,
// returned first, and appends the others to out, returned second.
func keepLast(rs, out []*shareRec) ([]*shareRec, []*shareRec) {
	kept := rs[:0]
	for _, r := range rs {
		if r.last {
			kept = append(kept, r)
		} else {
			out = append(out, r)
		}
	}
	clear(rs[len(kept):])
	return kept, out
}

// settle gives records their final acknowledgement and takes them out of
// the pipeline: the next record of each one's key becomes ready (or, during
// shutdown, is released too).
func (s *shareRun) settle(rs []*shareRec, status kgo.AckStatus) {
	for len(rs) > 0 {
		recs := make([]*kgo.Record, len(rs))
		for i, r := range rs {
			recs[i] = r.t.Value.rec
		}
		// Before the record leaves held: the next poll must find the
		// final status set, or the client would accept it.
		s.cl.MarkAcks(status, recs...)
		if status == kgo.AckRelease {
			s.released.Add(int64(len(rs)))
		}
		var more []*shareRec
		s.mu.Lock()
		for _, r := range rs {
			if _, ok := s.held[r]; !ok {
				continue
			}
			delete(s.held, r)
			if ln := r.lane; ln != nil {
				if r.active {
					r.active = false
					ln.active--
				}
				more = s.advanceLaneLocked(ln, more)
			}
		}
		if len(s.held) == 0 && s.empty != nil {
			close(s.empty)
			s.empty = nil
		}
		s.mu.Unlock()
		rs, status = more, kgo.AckRelease
	}
}

// advanceLaneLocked makes the next queued record of ln ready once none of
// its records is active; during shutdown a record not on its last delivery
// is appended to release instead. Called with mu held.
func (s *shareRun) advanceLaneLocked(ln *shareLane, release []*shareRec) []*shareRec {
	for ln.active == 0 && len(ln.queue) > 0 {
		r := ln.queue[0]
		ln.queue[0] = nil
		ln.queue = ln.queue[1:]
		if s.closing && !r.last {
			release = append(release, r)
			continue
		}
		r.active = true
		ln.active++
		s.ready = append(s.ready, r)
		s.cond.Signal()
	}
	if ln.active == 0 && len(ln.queue) == 0 && s.lanes[ln.key] == ln {
		delete(s.lanes, ln.key)
	}
	return release
}

// onAcks is the client's ShareAckCallback: it counts and logs failed
// acknowledgements (their records are delivered again).
func (s *shareRun) onAcks(_ *kgo.Client, rs kgo.ShareAckResults) {
	for _, r := range rs {
		if r.Err != nil {
			s.ackErrors.Add(1)
			s.log.Warn("kpar: share acknowledgement failed; the broker delivers those records again",
				"topic", r.Topic, "partition", r.Partition, "err", r.Err)
		}
	}
}
