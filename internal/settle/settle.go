// Package settle is what finished records leave for the settle of kpar's
// pipeline: the request to settle, the acknowledgements a share group
// sends, and the tallies a backfill reports.
//
// A record that finishes (Finished, FinishedRun) or is withdrawn
// (Released) asks for a settle (Ask): the first ask since the last settle
// began (Taken) is the one that wakes the settler, so a finished record
// costs a bool test. A source that acknowledges each record (AckEach,
// share groups) gets the finished records as ACCEPT and the withdrawn
// ones as RELEASE (TakeAcks); the others get only the request, since the
// windows carry their progress.
//
// Invariants: every record passed in is handed out by TakeAcks exactly
// once, in the order it came, when acks are on, and never held when they
// are off; an Ask that finds a request standing does not wake again.
// Outcomes is pure: no goroutines, no lock (the caller holds its own), no
// I/O; the caller owns the channel that wakes the settler.
package settle

import "github.com/twmb/franz-go/pkg/kgo"

// Outcomes is the settle's state.
type Outcomes struct {
	asked              bool // a record finished since the settle began
	acks               bool // acknowledge each record
	accepted, released []*kgo.Record
	// Tallies of finished records, for Backfill's result: all of them,
	// those that failed an attempt first, those dead-lettered.
	finished, failedFirst, deadLettered int64
}

// AckEach turns on acknowledgements: finished and withdrawn records are
// kept for TakeAcks.
func (o *Outcomes) AckEach() { o.acks = true }

// Ask asks for a settle, and reports whether it is a new request: the
// caller wakes the settler.
func (o *Outcomes) Ask() (wake bool) {
	if o.asked {
		return false
	}
	o.asked = true
	return true
}

// Taken clears the request: the settle beginning covers every record
// finished so far.
func (o *Outcomes) Taken() { o.asked = false }

// Finished counts a record finished (failedFirst: after a failed
// attempt) and keeps it for its ACCEPT.
func (o *Outcomes) Finished(r *kgo.Record, failedFirst bool) {
	o.finished++
	if failedFirst {
		o.failedFirst++
	}
	if o.acks {
		o.accepted = append(o.accepted, r)
	}
}

// FinishedRun counts the records of a run finished at once, none of which
// failed, and keeps them for their ACCEPT.
func (o *Outcomes) FinishedRun(rs []*kgo.Record) {
	o.finished += int64(len(rs))
	if o.acks {
		o.accepted = append(o.accepted, rs...)
	}
}

// Released keeps withdrawn records for their RELEASE.
func (o *Outcomes) Released(rs ...*kgo.Record) {
	if o.acks {
		o.released = append(o.released, rs...)
	}
}

// DeadLettered counts a record dead-lettered.
func (o *Outcomes) DeadLettered() { o.deadLettered++ }

// TakeAcks hands out, and forgets, the records to ACCEPT and to RELEASE.
func (o *Outcomes) TakeAcks() (accepted, released []*kgo.Record) {
	accepted, released = o.accepted, o.released
	o.accepted, o.released = nil, nil
	return accepted, released
}

// Tally is the records finished, those that failed an attempt first, and
// those dead-lettered.
func (o *Outcomes) Tally() (finished, failedFirst, deadLettered int64) {
	return o.finished, o.failedFirst, o.deadLettered
}
