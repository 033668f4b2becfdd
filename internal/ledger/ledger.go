// Package ledger checks kpar's guarantees on a run: it records every
// record produced, every successful handling, every dead letter and every
// commit, and reports what was lost, what was handled more than once, what
// was handled out of order and which commit went past an unfinished
// record. It is the one checker of the engine's tests, the chaos tests,
// `kpar demo` and the benchmarks' crash scenario.
//
// A Ledger is a pure data structure (no goroutines, no I/O) behind a mutex,
// so that producer callbacks, handlers and hooks may call it concurrently.
// Records are identified by topic, partition and offset, so Produced needs
// the record as acknowledged by the broker.
//
// A record is finished once it was handled successfully or dead-lettered
// (its dead-letter write acknowledged); a produced record never finished is
// lost.
//
// Order: in ByKey mode, a record's first successful handling must not come
// while an earlier record (lower offset) of the same topic, partition and
// key, already produced, is still unfinished; records with a nil key are not
// checked. ByPartition checks the same per partition. Retried records are
// no exception: what counts is the first success, whatever attempt it was.
// A dead-lettered record is finished without a success: it is never an
// order violation itself and no longer holds back the records after it.
// A record handled before its production was acknowledged is counted when
// the acknowledgement comes, and an earlier record whose acknowledgement
// comes after a later one was handled cannot be seen as overtaken: the
// check can miss a violation in that race, never report a false one.
//
// Commits: a committed offset o for a partition promises that every record
// below o is finished. Committed counts a commit violation when a produced
// record below o is not, the engine's one unforgivable bug (a crash then
// loses it). The same acknowledgement race applies: a record produced but
// not yet acknowledged is not seen.
//
// Rates: MaxInWindow measures the peak rate a run kept, what RateLimit
// bounds, for the engine's rate tests and the benchmarks' rate scenario.
package ledger

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Order is the ordering a Ledger checks.
type Order int

const (
	// Unordered checks no order.
	Unordered Order = iota
	// ByKey checks order per topic, partition and (non-nil) key.
	ByKey
	// ByPartition checks order per topic and partition.
	ByPartition
)

// Report is what a Ledger saw so far.
type Report struct {
	Produced     int64 // records whose production was acknowledged
	Handled      int64 // distinct produced records handled successfully at least once
	DeadLettered int64 // distinct produced records dead-lettered at least once
	Duplicates   int64 // successful handlings after a record's first
	// Lost is the produced records never finished (neither handled nor
	// dead-lettered): at the end of a run, the records lost.
	Lost int64
	// Unexpected counts distinct records handled or dead-lettered but
	// never produced (so far): another producer's, or a record whose
	// acknowledgement is late.
	Unexpected      int64
	OrderViolations int64 // first handlings that overtook an earlier record of their key or partition
	// CommitViolations counts commits that went past an unfinished
	// produced record.
	CommitViolations int64
	// FirstViolation describes the first order or commit violation, for
	// the test's failure message; "" when there is none.
	FirstViolation string

	// Outputs, once a reader's outputs were noted (Output): the produced
	// records with none, those with more than one (at least once allows
	// them, exactly once does not), outputs of no produced record, and
	// outputs of a key seen before those of an earlier record of the key
	// (per the ledger's Order).
	OutputsMissing    int64
	OutputsRepeated   int64
	OutputsUnexpected int64
	OutputsOutOfOrder int64
}

// Check returns an error describing each broken guarantee of a finished
// run: records lost, unexpected records, order and commit violations, and
// more than maxDuplicates duplicates (no bound when negative).
func (r Report) Check(maxDuplicates int64) error {
	var bad []string
	if r.Lost != 0 {
		bad = append(bad, fmt.Sprintf("%d lost", r.Lost))
	}
	if r.Unexpected != 0 {
		bad = append(bad, fmt.Sprintf("%d handled but never produced", r.Unexpected))
	}
	if r.OrderViolations != 0 {
		bad = append(bad, fmt.Sprintf("%d order violations", r.OrderViolations))
	}
	if r.CommitViolations != 0 {
		bad = append(bad, fmt.Sprintf("%d commits past an unfinished record", r.CommitViolations))
	}
	if maxDuplicates >= 0 && r.Duplicates > maxDuplicates {
		bad = append(bad, fmt.Sprintf("%d duplicates, bound %d", r.Duplicates, maxDuplicates))
	}
	if len(bad) == 0 {
		return nil
	}
	msg := strings.Join(bad, ", ")
	if r.FirstViolation != "" {
		msg += "; first violation: " + r.FirstViolation
	}
	return fmt.Errorf("%s (%+v)", msg, r.counts())
}

// CheckOutputs returns an error describing what is wrong with the outputs
// of a finished run: a produced record with none, an output of no
// produced record, one out of its key's order, and, when exact, a record
// with more than one.
func (r Report) CheckOutputs(exact bool) error {
	var bad []string
	if r.OutputsMissing != 0 {
		bad = append(bad, fmt.Sprintf("%d records without an output", r.OutputsMissing))
	}
	if r.OutputsUnexpected != 0 {
		bad = append(bad, fmt.Sprintf("%d outputs of no produced record", r.OutputsUnexpected))
	}
	if r.OutputsOutOfOrder != 0 {
		bad = append(bad, fmt.Sprintf("%d outputs out of their key's order", r.OutputsOutOfOrder))
	}
	if exact && r.OutputsRepeated != 0 {
		bad = append(bad, fmt.Sprintf("%d records with more than one output (exactly once)", r.OutputsRepeated))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%s (%+v)", strings.Join(bad, ", "), r.counts())
}

// counts is r without its description, for messages.
func (r Report) counts() Report { r.FirstViolation = ""; return r }

// Ledger records productions, handlings, dead letters and commits; see the
// package doc.
type Ledger struct {
	order Order
	want  int64
	all   chan struct{}

	mu       sync.Mutex // guards the fields below
	records  map[rid]*state
	streams  map[sid]*stream // ordered streams, per the Order
	parts    map[sid]*stream // per partition (key ""), for the commit check
	rep      Report
	finished int64          // distinct produced records finished
	closed   bool           // all is closed
	waiters  []waiter       // Reached channels not closed yet
	lastOut  map[string]rid // the last first output of each key (Output)
	outputs  bool           // outputs are counted (ExpectOutputs, Output)
}

// waiter is a channel to close once n records are finished.
type waiter struct {
	n  int64
	ch chan struct{}
}

type rid struct {
	topic     string
	partition int32
	offset    int64
}

// sid names an offset stream: a partition, or a key of a partition.
type sid struct {
	topic     string
	partition int32
	key       string
}

type state struct {
	produced bool
	handled  int32 // successful handlings
	dead     bool  // dead-lettered at least once
	outputs  int32 // outputs a reader saw (Output)
	stream   *stream
	part     *stream
}

func (s *state) finished() bool { return s.handled > 0 || s.dead }

// hold puts a produced, unfinished record at off into the streams it holds
// back (its key's or partition's, and its partition's for the commit
// check) until release.
func (s *state) hold(off int64) {
	if s.stream != nil {
		s.stream.insert(off)
	}
	s.part.insert(off)
}

// release takes the record at off, just finished, out of the streams hold
// put it in.
func (s *state) release(off int64) {
	if s.stream != nil {
		s.stream.remove(off)
	}
	s.part.remove(off)
}

// stream holds the produced and not yet finished offsets of one stream,
// sorted; acknowledgements arrive in offset order per partition, so appends
// are the common case.
type stream struct{ pending []int64 }

// New returns a Ledger checking order. want is how many records the run
// produces (0 if unknown): AllHandled is closed once that many distinct
// produced records were finished.
func New(order Order, want int64) *Ledger {
	return &Ledger{order: order, want: want, all: make(chan struct{}),
		records: make(map[rid]*state), streams: make(map[sid]*stream), parts: make(map[sid]*stream)}
}

// AllHandled is closed once want distinct produced records were finished
// (handled successfully or dead-lettered).
func (l *Ledger) AllHandled() <-chan struct{} { return l.all }

// Reached returns a channel closed once n distinct produced records were
// finished: a test waits for progress with it, without polling.
func (l *Ledger) Reached(n int64) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := make(chan struct{})
	if l.finished >= n {
		close(ch)
		return ch
	}
	l.waiters = append(l.waiters, waiter{n, ch})
	return ch
}

// Produced records a record acknowledged by the broker (its Partition and
// Offset set).
func (l *Ledger) Produced(r *kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.state(r)
	if s.produced {
		return
	}
	s.produced = true
	l.rep.Produced++
	if s.finished() {
		l.rep.Unexpected--
		if s.handled > 0 {
			l.rep.Handled++
		}
		if s.dead {
			l.rep.DeadLettered++
		}
		l.finish()
		return
	}
	s.hold(r.Offset)
}

// Handled records a successful handling of r.
func (l *Ledger) Handled(r *kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.state(r)
	if s.handled++; s.handled > 1 {
		l.rep.Duplicates++
		return
	}
	if !s.produced {
		if !s.dead {
			l.rep.Unexpected++
		}
		return
	}
	if s.dead {
		// Dead-lettered, then handled after all (re-delivered after a
		// crash before its commit): finished already.
		l.rep.Handled++
		return
	}
	if st := s.stream; st != nil && len(st.pending) > 0 && st.pending[0] < r.Offset {
		l.rep.OrderViolations++
		l.violation("%s/%d@%d (key %q) handled before %s/%d@%d of its %s", r.Topic, r.Partition, r.Offset, r.Key,
			r.Topic, r.Partition, st.pending[0], l.streamName())
	}
	l.rep.Handled++
	s.release(r.Offset)
	l.finish()
}

// DeadLettered records that r's dead letter was written (acknowledged by
// the sink).
func (l *Ledger) DeadLettered(r *kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.state(r)
	if s.dead {
		return
	}
	s.dead = true
	if !s.produced {
		if s.handled == 0 {
			l.rep.Unexpected++
		}
		return
	}
	l.rep.DeadLettered++
	if s.handled == 0 {
		s.release(r.Offset)
		l.finish()
	}
}

// Committed records a successful commit of offset for a partition: every
// record below it must be finished.
func (l *Ledger) Committed(topic string, partition int32, offset int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.parts[sid{topic: topic, partition: partition}]
	if st == nil || len(st.pending) == 0 || st.pending[0] >= offset {
		return
	}
	l.rep.CommitViolations++
	l.violation("commit of %s/%d at %d while %d is unfinished", topic, partition, offset, st.pending[0])
}

// ExpectOutputs makes Report count the outputs (Output) even when none was
// noted: every produced record then misses its own.
func (l *Ledger) ExpectOutputs() {
	l.mu.Lock()
	l.outputs = true
	l.mu.Unlock()
}

// Output notes an output a reader saw, in the order it saw them, of the
// record at topic/partition/offset, keyed like it (the outputs of a key
// share an output partition, so a reader sees them in the order they were
// written). Report counts the outputs once the reader noted them all.
func (l *Ledger) Output(topic string, partition int32, offset int64, key []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.outputs = true
	s := l.records[rid{topic, partition, offset}]
	if s == nil || !s.produced {
		l.rep.OutputsUnexpected++
		return
	}
	s.outputs++
	if s.outputs > 1 || l.order == Unordered {
		return
	}
	if l.lastOut == nil {
		l.lastOut = make(map[string]rid)
	}
	k := string(key)
	if prev, ok := l.lastOut[k]; ok && prev.topic == topic && prev.partition == partition && prev.offset > offset {
		l.rep.OutputsOutOfOrder++
		l.violation("output of %s/%d/%d after that of %d, key %q", topic, partition, offset, prev.offset, key)
	}
	l.lastOut[k] = rid{topic, partition, offset}
}

// Report returns the counts so far.
func (l *Ledger) Report() Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	rep := l.rep
	rep.Lost = rep.Produced - l.finished
	if l.outputs {
		for _, s := range l.records {
			switch {
			case !s.produced:
			case s.outputs == 0:
				rep.OutputsMissing++
			case s.outputs > 1:
				rep.OutputsRepeated++
			}
		}
	}
	return rep
}

// finish counts a produced record's first finish. Called with mu held.
func (l *Ledger) finish() {
	l.finished++
	if !l.closed && l.want > 0 && l.finished >= l.want {
		l.closed = true
		close(l.all)
	}
	if len(l.waiters) > 0 {
		l.waiters = slices.DeleteFunc(l.waiters, func(w waiter) bool {
			if l.finished >= w.n {
				close(w.ch)
				return true
			}
			return false
		})
	}
}

// violation notes the first violation's description. Called with mu held.
func (l *Ledger) violation(format string, args ...any) {
	if l.rep.FirstViolation == "" {
		l.rep.FirstViolation = fmt.Sprintf(format, args...)
	}
}

func (l *Ledger) streamName() string {
	if l.order == ByPartition {
		return "partition"
	}
	return "key"
}

// state returns r's state, creating it. Called with mu held.
func (l *Ledger) state(r *kgo.Record) *state {
	id := rid{r.Topic, r.Partition, r.Offset}
	s := l.records[id]
	if s != nil {
		return s
	}
	s = new(state)
	l.records[id] = s
	pk := sid{topic: r.Topic, partition: r.Partition}
	if s.part = l.parts[pk]; s.part == nil {
		s.part = new(stream)
		l.parts[pk] = s.part
	}
	var key sid
	switch {
	case l.order == ByPartition:
		key = pk
	case l.order == ByKey && r.Key != nil:
		key = sid{r.Topic, r.Partition, string(r.Key)}
	default:
		return s
	}
	st := l.streams[key]
	if st == nil {
		st = new(stream)
		l.streams[key] = st
	}
	s.stream = st
	return s
}

func (st *stream) insert(off int64) {
	if n := len(st.pending); n == 0 || st.pending[n-1] < off {
		st.pending = append(st.pending, off)
		return
	}
	if i, found := slices.BinarySearch(st.pending, off); !found {
		st.pending = slices.Insert(st.pending, i, off)
	}
}

func (st *stream) remove(off int64) {
	if len(st.pending) > 0 && st.pending[0] == off {
		st.pending = st.pending[1:]
		return
	}
	if i, found := slices.BinarySearch(st.pending, off); found {
		st.pending = slices.Delete(st.pending, i, i+1)
	}
}
