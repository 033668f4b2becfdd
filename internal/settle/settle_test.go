package settle

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestOnlyTheFirstAskWakesTheSettler(t *testing.T) {
	var o Outcomes
	if !o.Ask() || o.Ask() {
		t.Fatal("the first ask wakes, the second does not")
	}
	o.Taken()
	if !o.Ask() {
		t.Fatal("the first ask after a settle began does not wake")
	}
}

func TestWithoutAcksNoRecordIsKept(t *testing.T) {
	var o Outcomes
	o.Finished(&kgo.Record{}, true)
	o.FinishedRun([]*kgo.Record{{}, {}})
	o.Released(&kgo.Record{})
	o.DeadLettered()
	if a, r := o.TakeAcks(); a != nil || r != nil {
		t.Fatalf("kept %d accepted and %d released without acks", len(a), len(r))
	}
	if f, ff, d := o.Tally(); f != 3 || ff != 1 || d != 1 {
		t.Fatalf("tally %d finished, %d failed first, %d dead-lettered", f, ff, d)
	}
}

// FuzzAcks: with acks on, every record passed in comes out of TakeAcks
// once, in order, on the side it went in.
func FuzzAcks(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 0, 3})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var o Outcomes
		o.AckEach()
		var wantA, wantR, gotA, gotR []int64
		next := int64(0)
		rec := func() *kgo.Record { next++; return &kgo.Record{Offset: next} }
		for _, op := range ops {
			switch op % 4 {
			case 0:
				r := rec()
				o.Finished(r, op&4 != 0)
				wantA = append(wantA, r.Offset)
			case 1:
				rs := []*kgo.Record{rec(), rec()}
				o.FinishedRun(rs)
				wantA = append(wantA, rs[0].Offset, rs[1].Offset)
			case 2:
				r := rec()
				o.Released(r)
				wantR = append(wantR, r.Offset)
			case 3:
				a, r := o.TakeAcks()
				for _, x := range a {
					gotA = append(gotA, x.Offset)
				}
				for _, x := range r {
					gotR = append(gotR, x.Offset)
				}
			}
		}
		a, r := o.TakeAcks()
		for _, x := range a {
			gotA = append(gotA, x.Offset)
		}
		for _, x := range r {
			gotR = append(gotR, x.Offset)
		}
		if len(gotA) != len(wantA) || len(gotR) != len(wantR) {
			t.Fatalf("accepted %v released %v, want %v and %v", gotA, gotR, wantA, wantR)
		}
		for i := range gotA {
			if gotA[i] != wantA[i] {
				t.Fatalf("accepted %v, want %v", gotA, wantA)
			}
		}
		for i := range gotR {
			if gotR[i] != wantR[i] {
				t.Fatalf("released %v, want %v", gotR, wantR)
			}
		}
	})
}
