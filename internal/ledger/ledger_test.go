package ledger

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func rec(p int32, off int64, key string) *kgo.Record {
	r := &kgo.Record{Topic: "t", Partition: p, Offset: off}
	if key != "" {
		r.Key = []byte(key)
	}
	return r
}

func TestLedger(t *testing.T) {
	type step struct {
		produce bool
		r       *kgo.Record
	}
	P := func(p int32, off int64, key string) step { return step{true, rec(p, off, key)} }
	H := func(p int32, off int64, key string) step { return step{false, rec(p, off, key)} }
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.order, 0)
			for _, s := range tc.steps {
				if s.produce {
					l.Produced(s.r)
				} else {
					l.Handled(s.r)
				}
			}
			if got := l.Report(); got != tc.want {
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
	select {
	case <-l.AllHandled():
		t.Fatal("closed with a record unhandled")
	default:
	}
	l.Handled(rec(0, 1, "a"))
	<-l.AllHandled()
	l.Handled(rec(0, 1, "a")) // a duplicate after the end must not close it again
}
