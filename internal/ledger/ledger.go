// Package ledger checks kpar's guarantees on a run: it records every
// record produced and every successful handling, and reports what was
// lost, what was handled more than once, and what was handled out of
// order. It is one checker for the engine's tests, `kpar demo` and the
// benchmarks.
//
// A Ledger is a pure data structure (no goroutines, no I/O) behind a mutex,
// so that producer callbacks and handlers may call it concurrently.
// Records are identified by topic, partition and offset, so Produced needs
// the record as acknowledged by the broker.
//
// Order: in ByKey mode, a record's first successful handling must not come
// while an earlier record (lower offset) of the same topic, partition and
// key, already produced, is still unhandled; records with a nil key are not
// checked. ByPartition checks the same per partition. A record handled
// before its production was acknowledged is counted when the
// acknowledgement comes, and an earlier record whose acknowledgement comes
// after a later one was handled cannot be seen as overtaken: the check can
// miss a violation in that race, never report a false one.
package ledger

import (
	"slices"
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
	Produced   int64 // records whose production was acknowledged
	Handled    int64 // distinct produced records handled successfully at least once
	Duplicates int64 // successful handlings after a record's first
	// Lost is Produced - Handled: at the end of a run, the records never
	// handled.
	Lost int64
	// Unexpected counts distinct records handled but never produced (so
	// far): another producer's, or a record whose acknowledgement is late.
	Unexpected      int64
	OrderViolations int64 // first handlings that overtook an earlier record of their key or partition
}

// Ledger records productions and handlings; see the package doc.
type Ledger struct {
	order Order
	want  int64
	all   chan struct{}

	mu      sync.Mutex // guards the fields below
	records map[rid]*state
	streams map[sid]*stream
	rep     Report
	closed  bool // all is closed
}

type rid struct {
	topic     string
	partition int32
	offset    int64
}

// sid names an ordered stream: a partition, or a key of a partition.
type sid struct {
	topic     string
	partition int32
	key       string
}

type state struct {
	produced bool
	handled  int32 // successful handlings
	stream   *stream
}

// stream holds the produced and not yet handled offsets of one ordered
// stream, sorted; acknowledgements arrive in offset order per partition,
// so appends are the common case.
type stream struct{ pending []int64 }

// New returns a Ledger checking order. want is how many records the run
// produces (0 if unknown): AllHandled is closed once that many distinct
// produced records were handled.
func New(order Order, want int64) *Ledger {
	return &Ledger{order: order, want: want, all: make(chan struct{}),
		records: make(map[rid]*state), streams: make(map[sid]*stream)}
}

// AllHandled is closed once want distinct produced records were handled.
func (l *Ledger) AllHandled() <-chan struct{} { return l.all }

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
	if s.handled > 0 {
		l.rep.Unexpected--
		l.counted()
		return
	}
	if s.stream != nil {
		s.stream.insert(r.Offset)
	}
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
		l.rep.Unexpected++
		return
	}
	if st := s.stream; st != nil {
		if len(st.pending) > 0 && st.pending[0] < r.Offset {
			l.rep.OrderViolations++
		}
		st.remove(r.Offset)
	}
	l.counted()
}

// Report returns the counts so far.
func (l *Ledger) Report() Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	rep := l.rep
	rep.Lost = rep.Produced - rep.Handled
	return rep
}

// counted counts a produced record's first handling. Called with mu held.
func (l *Ledger) counted() {
	l.rep.Handled++
	if !l.closed && l.want > 0 && l.rep.Handled >= l.want {
		l.closed = true
		close(l.all)
	}
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
	var key sid
	switch {
	case l.order == ByPartition:
		key = sid{topic: r.Topic, partition: r.Partition}
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
