package ledger

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func rec(p int32, off int64, key string) *kgo.Record {
	r := &kgo.Record{Topic: "t", Partition: p, Offset: off}
	if key != "" {
		r.Key = []byte(key)
	}
	return r
}

// notClosed fails the test if ch is closed already.
func notClosed(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal(why)
	default:
	}
}

func TestLedger(t *testing.T) {
	type step struct {
		what byte // 'P'roduced, 'H'andled, 'D'ead-lettered, 'C'ommitted
		r    *kgo.Record
	}
	P := func(p int32, off int64, key string) step { return step{'P', rec(p, off, key)} }
	H := func(p int32, off int64, key string) step { return step{'H', rec(p, off, key)} }
	D := func(p int32, off int64, key string) step { return step{'D', rec(p, off, key)} }
	C := func(p int32, off int64) step { return step{'C', rec(p, off, "")} }
	for _, tc := range []struct {
		name  string
		order Order
		steps []step
		want  Report
	}{
		{"in order", ByKey, []step{P(0, 0, "a"), P(0, 1, "a"), H(0, 0, "a"), H(0, 1, "a")},
			Report{Produced: 2, Handled: 2}},
		{"other keys may overtake", ByKey, []step{P(0, 0, "a"), P(0, 1, "b"), H(0, 1, "b"), H(0, 0, "a")},
			Report{Produced: 2, Handled: 2}},
		{"same key overtaken", ByKey, []step{P(0, 0, "a"), P(0, 1, "b"), P(0, 2, "a"), H(0, 2, "a"), H(0, 0, "a")},
			Report{Produced: 3, Handled: 2, Lost: 1, OrderViolations: 1}},
		{"nil keys unordered", ByKey, []step{P(0, 0, ""), P(0, 1, ""), H(0, 1, ""), H(0, 0, "")},
			Report{Produced: 2, Handled: 2}},
		{"partition overtaken", ByPartition, []step{P(0, 0, "a"), P(0, 1, "b"), H(0, 1, "b"), H(0, 0, "a")},
			Report{Produced: 2, Handled: 2, OrderViolations: 1}},
		{"partitions independent", ByPartition, []step{P(0, 0, ""), P(1, 0, ""), H(1, 0, ""), H(0, 0, "")},
			Report{Produced: 2, Handled: 2}},
		{"unordered", Unordered, []step{P(0, 0, "a"), P(0, 1, "a"), H(0, 1, "a"), H(0, 0, "a")},
			Report{Produced: 2, Handled: 2}},
		{"duplicates", ByKey, []step{P(0, 0, "a"), H(0, 0, "a"), H(0, 0, "a"), H(0, 0, "a")},
			Report{Produced: 1, Handled: 1, Duplicates: 2}},
		{"handled before its ack", ByKey, []step{P(0, 0, "a"), H(0, 0, "a"), H(0, 1, "a"), P(0, 1, "a")},
			Report{Produced: 2, Handled: 2}},
		{"never produced", ByKey, []step{H(0, 5, "a")}, Report{Unexpected: 1}},
		{"late duplicate is not a violation", ByKey, []step{P(0, 0, "a"), P(0, 1, "a"), H(0, 0, "a"), H(0, 1, "a"), H(0, 0, "a")},
			Report{Produced: 2, Handled: 2, Duplicates: 1}},
		{"retried record overtaken", ByKey, []step{P(0, 0, "a"), P(0, 1, "a"), H(0, 1, "a"), H(0, 0, "a")},
			Report{Produced: 2, Handled: 2, OrderViolations: 1}},
		{"dead letter finishes", ByKey, []step{P(0, 0, "a"), P(0, 1, "a"), D(0, 0, "a"), H(0, 1, "a")},
			Report{Produced: 2, Handled: 1, DeadLettered: 1}},
		{"dead letter is never a violation", ByPartition, []step{P(0, 0, ""), P(0, 1, ""), D(0, 1, ""), H(0, 0, "")},
			Report{Produced: 2, Handled: 1, DeadLettered: 1}},
		{"dead-lettered then handled", ByKey, []step{P(0, 0, "a"), D(0, 0, "a"), H(0, 0, "a"), D(0, 0, "a")},
			Report{Produced: 1, Handled: 1, DeadLettered: 1}},
		{"dead-lettered before its ack", Unordered, []step{D(0, 0, "a"), P(0, 0, "a")},
			Report{Produced: 1, DeadLettered: 1}},
		{"dead letter never produced", Unordered, []step{D(0, 0, "a"), H(0, 0, "a")}, Report{Unexpected: 1}},
		{"commit up to the unfinished", Unordered, []step{P(0, 0, ""), P(0, 1, ""), P(0, 2, ""), H(0, 0, ""), H(0, 2, ""), C(0, 1)},
			Report{Produced: 3, Handled: 2, Lost: 1}},
		{"commit past the unfinished", Unordered, []step{P(0, 0, ""), P(0, 1, ""), H(0, 0, ""), C(0, 2)},
			Report{Produced: 2, Handled: 1, Lost: 1, CommitViolations: 1}},
		{"commit past a dead letter", ByKey, []step{P(0, 0, "a"), P(0, 1, "b"), D(0, 0, "a"), H(0, 1, "b"), C(0, 2)},
			Report{Produced: 2, Handled: 1, DeadLettered: 1}},
		{"commit of another partition", ByKey, []step{P(0, 0, "a"), P(1, 0, "a"), H(1, 0, "a"), C(1, 1), C(2, 5)},
			Report{Produced: 2, Handled: 1, Lost: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.order, 0)
			for _, s := range tc.steps {
				switch s.what {
				case 'P':
					l.Produced(s.r)
				case 'H':
					l.Handled(s.r)
				case 'D':
					l.DeadLettered(s.r)
				case 'C':
					l.Committed(s.r.Topic, s.r.Partition, s.r.Offset)
				}
			}
			got := l.Report()
			if (got.FirstViolation != "") != (got.OrderViolations+got.CommitViolations > 0) {
				t.Errorf("first violation %q with %d order and %d commit violations", got.FirstViolation, got.OrderViolations, got.CommitViolations)
			}
			if got.FirstViolation = ""; got != tc.want {
				t.Fatalf("report %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestLedgerAllHandled(t *testing.T) {
	l := New(ByKey, 2)
	l.Produced(rec(0, 0, "a"))
	l.Produced(rec(0, 1, "a"))
	l.Handled(rec(0, 0, "a"))
	l.Handled(rec(0, 0, "a"))
	notClosed(t, l.AllHandled(), "closed with a record unhandled")
	l.Handled(rec(0, 1, "a"))
	<-l.AllHandled()
	l.Handled(rec(0, 1, "a")) // a duplicate after the end must not close it again
}

func TestLedgerAllHandledCountsDeadLetters(t *testing.T) {
	l := New(Unordered, 2)
	l.Produced(rec(0, 0, "a"))
	l.Produced(rec(0, 1, "a"))
	l.DeadLettered(rec(0, 0, "a"))
	l.Handled(rec(0, 0, "a")) // finished already: no second count
	notClosed(t, l.AllHandled(), "closed with a record unfinished")
	l.DeadLettered(rec(0, 1, "a"))
	<-l.AllHandled()
}

func TestReportCheck(t *testing.T) {
	for _, tc := range []struct {
		rep  Report
		max  int64
		want string // "" for no error, else a part of the message
	}{
		{Report{Produced: 3, Handled: 3, Duplicates: 2}, 2, ""},
		{Report{Produced: 3, Handled: 3, Duplicates: 9}, -1, ""},
		{Report{Produced: 3, Handled: 3, Duplicates: 3}, 2, "3 duplicates, bound 2"},
		{Report{Produced: 3, Handled: 2, Lost: 1}, -1, "1 lost"},
		{Report{Unexpected: 1}, -1, "1 handled but never produced"},
		{Report{OrderViolations: 1, FirstViolation: "t/0@2 first"}, -1, "1 order violations; first violation: t/0@2 first"},
		{Report{CommitViolations: 2}, -1, "2 commits past an unfinished record"},
	} {
		err := tc.rep.Check(tc.max)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v, want nil", tc.rep, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want %q", tc.rep, err, tc.want)
		}
	}
}

func TestLedgerReached(t *testing.T) {
	l := New(Unordered, 0)
	l.Produced(rec(0, 0, ""))
	l.Produced(rec(0, 1, ""))
	one, two := l.Reached(1), l.Reached(2)
	l.Handled(rec(0, 0, ""))
	<-one
	notClosed(t, two, "two reached after one record")
	l.Handled(rec(0, 0, "")) // a duplicate is no progress
	notClosed(t, two, "two reached by a duplicate")
	l.DeadLettered(rec(0, 1, ""))
	<-two
	<-l.Reached(2) // reached already: closed at once
}

func TestMaxInWindow(t *testing.T) {
	at := func(ms ...int) []time.Time {
		ts := make([]time.Time, len(ms))
		for i, m := range ms {
			ts[i] = time.Unix(0, 0).Add(time.Duration(m) * time.Millisecond)
		}
		return ts
	}
	for _, tc := range []struct {
		ts   []time.Time
		want int
	}{
		{nil, 0},
		{at(0), 1},
		{at(0, 999), 2},
		{at(0, 1000), 1},                 // a window is half-open: 1000ms apart is two windows
		{at(1500, 0, 100, 1200, 900), 3}, // unsorted: 0, 100 and 900, or 900, 1200 and 1500
	} {
		ts := slices.Clone(tc.ts)
		if got := MaxInWindow(tc.ts, time.Second); got != tc.want {
			t.Errorf("MaxInWindow(%v) = %d, want %d", tc.ts, got, tc.want)
		}
		if !slices.Equal(ts, tc.ts) {
			t.Errorf("MaxInWindow reordered its argument: %v", tc.ts)
		}
	}
}

// TestLedgerChecksOutputs: outputs are counted per produced record:
// missing, repeated (an error exactly once, not at least once), of no
// produced record, and out of their key's order.
func TestLedgerChecksOutputs(t *testing.T) {
	l := New(ByKey, 3)
	for off := range int64(3) {
		l.Produced(&kgo.Record{Topic: "t", Partition: 0, Offset: off, Key: []byte("k")})
	}
	l.Output("t", 0, 0, []byte("k"))
	l.Output("t", 0, 2, []byte("k"))
	l.Output("t", 0, 2, []byte("k"))
	if err := l.Report().CheckOutputs(false); err == nil || !strings.Contains(err.Error(), "1 records without an output") {
		t.Fatalf("CheckOutputs(at least once) = %v, want offset 1's output missing", err)
	}
	l.Output("t", 0, 1, []byte("k")) // after offset 2's: out of order
	l.Output("t", 0, 9, []byte("k"))
	rep := l.Report()
	if rep.OutputsMissing != 0 || rep.OutputsRepeated != 1 || rep.OutputsUnexpected != 1 || rep.OutputsOutOfOrder != 1 {
		t.Fatalf("report %+v", rep)
	}
	if err := rep.CheckOutputs(true); err == nil || !strings.Contains(err.Error(), "more than one output") {
		t.Fatalf("CheckOutputs(exactly once) = %v", err)
	}
}
