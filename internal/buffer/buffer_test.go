package buffer

import "testing"

func TestAPartitionOverItsShareOfAUsedUpBudgetPausesUntilHalfOfIt(t *testing.T) {
	b := New(100)
	var hog, other Part
	for range 9 {
		b.Admit(&hog, 10)
	}
	b.Admit(&other, 10)
	if !b.Full() {
		t.Fatal("100 of 100 bytes: not full")
	}
	share := b.FairShare(2)
	if b.OverShare(&other, share) || !b.OverShare(&hog, share) {
		t.Fatal("the hog (90 of a share of 50) and only it is over its share")
	}
	if changed, paused := hog.Sync(); !changed || !paused {
		t.Fatalf("hog sync: changed %v paused %v", changed, paused)
	}
	if b.OverShare(&hog, share) {
		t.Fatal("an over-share noted twice")
	}
	// 90 -> 30: above half a share (25) it stays paused.
	for range 6 {
		if b.Finish(&hog, 10, 1, 2) {
			t.Fatalf("resumed at %d bytes, above half its share", hog.Bytes())
		}
	}
	if !b.Finish(&hog, 10, 1, 2) {
		t.Fatal("not resumed at 20 bytes, half its share 25")
	}
	if changed, paused := hog.Sync(); !changed || paused {
		t.Fatalf("hog sync: changed %v paused %v", changed, paused)
	}
	if b.Full() || b.Pending() != 3 || b.Bytes() != 30 {
		t.Fatalf("full %v, pending %d, bytes %d", b.Full(), b.Pending(), b.Bytes())
	}
}

func TestParkedRecordsLeaveTheBudgetButNotThePartition(t *testing.T) {
	b := New(20)
	var p Part
	b.Admit(&p, 10)
	b.Admit(&p, 10)
	b.Park(&p, 10)
	if b.Full() || b.Bytes() != 10 || p.Bytes() != 20 || b.Pending() != 2 {
		t.Fatalf("parked: full %v, bytes %d, part %d, pending %d", b.Full(), b.Bytes(), p.Bytes(), b.Pending())
	}
	if b.OverShare(&p, 15) {
		t.Fatal("parked bytes counted against the share")
	}
	b.Unpark(&p, 10)
	if !b.Full() {
		t.Fatal("unparked: not full")
	}
}

func TestHeldAndOverShareAreTwoReasons(t *testing.T) {
	b := New(10)
	var p Part
	b.Admit(&p, 20)
	if !p.SetHeldFull(true) || p.SetHeldFull(true) {
		t.Fatal("SetHeldFull reports changes only")
	}
	if c, paused := p.Sync(); !c || !paused {
		t.Fatal("held full: not paused")
	}
	b.OverShare(&p, 5)
	p.SetHeldFull(false)
	if c, paused := p.Sync(); c || !paused {
		t.Fatal("over its share still: resumed")
	}
	if !b.Drop(&p, 1) || p.Paused() || b.Bytes() != 0 || b.Pending() != 0 {
		t.Fatalf("dropped: paused %v bytes %d pending %d", p.Paused(), b.Bytes(), b.Pending())
	}
}

func TestAdmissionStopsAtTheBudgetPlusOneRecord(t *testing.T) {
	b := New(100)
	var p, q Part
	n := 0
	for b.Admits(&p, 1) {
		b.Admit(&p, 30)
		n++
	}
	if n != 4 || b.Bytes() != 120 {
		t.Fatalf("admitted %d records of 30 (%d bytes) into a budget of 100, want 4 (the last one over it)", n, b.Bytes())
	}
	b = New(100)
	b.Admit(&q, 0) // an empty budget admits a record larger than it, alone
	if !b.Admits(&p, 1) {
		t.Fatal("a record larger than the budget is never admitted")
	}
	b.Admit(&p, 500)
	if b.Admits(&p, 1) || b.Admits(&q, 1) {
		t.Fatal("admitted past a record larger than the budget")
	}
}

func TestAPartitionOverItsShareLeavesHalfTheBudgetToTheOthers(t *testing.T) {
	b := New(100)
	var stuck, other Part
	for b.Admits(&stuck, 2) {
		b.Admit(&stuck, 10)
	}
	if stuck.Bytes() != 50 {
		t.Fatalf("a partition over its share (50) took %d bytes, want it stopped at half the budget", stuck.Bytes())
	}
	for b.Admits(&other, 2) {
		b.Admit(&other, 10)
	}
	if other.Bytes() != 50 || b.Bytes() != 100 {
		t.Fatalf("the other partition took %d bytes (total %d), want the other half", other.Bytes(), b.Bytes())
	}
	b.Park(&stuck, 30) // parked records leave its share too
	if !b.Admits(&stuck, 2) {
		t.Fatal("a partition at 20 unparked bytes of a share of 50 cannot admit")
	}
}

func TestDrainEndsWhenTheLastRecordFinishes(t *testing.T) {
	b := New(100)
	var p Part
	if b.Drained() {
		t.Fatal("drained before a drain began")
	}
	b.Admit(&p, 1)
	if b.Drain() || b.Drained() {
		t.Fatal("drained with a record pending")
	}
	b.Finish(&p, 1, 1, 1)
	if !b.Drained() {
		t.Fatal("not drained after the last record finished")
	}
}

// FuzzBudget: whatever the admissions, parks, finishes and drops over
// three partitions, the total's bytes are the sum of the live partitions'
// unparked bytes, pending counts the unfinished records, and a synced
// partition is paused exactly when it has a reason to be.
func FuzzBudget(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 9})
	f.Add([]byte{0, 8, 16, 24, 1, 9})
	f.Fuzz(func(t *testing.T, ops []byte) {
		b := New(64)
		var parts [3]Part
		var live [3]bool
		var recs [3][]int64 // sizes of unfinished records, unparked
		var parked [3][]int64
		for i := range live {
			live[i] = true
		}
		pending := 0
		for _, op := range ops {
			i, p := int(op>>3)%3, &parts[int(op>>3)%3]
			size := int64(op&7) + 1
			switch op % 8 {
			case 0, 1:
				if live[i] {
					b.Admit(p, size)
					recs[i] = append(recs[i], size)
					pending++
				}
			case 2:
				if live[i] && len(recs[i]) > 0 {
					s := recs[i][0]
					recs[i] = recs[i][1:]
					b.Finish(p, s, 1, 3)
					pending--
				}
			case 3:
				if live[i] && len(recs[i]) > 0 {
					s := recs[i][0]
					recs[i] = recs[i][1:]
					b.Park(p, s)
					parked[i] = append(parked[i], s)
				}
			case 4:
				if live[i] && len(parked[i]) > 0 {
					s := parked[i][0]
					parked[i] = parked[i][1:]
					b.Unpark(p, s)
					recs[i] = append(recs[i], s)
				}
			case 5:
				if live[i] {
					b.OverShare(p, b.FairShare(3))
				}
			case 6:
				if op&1 == 0 {
					p.SetHeldFull(!p.HeldFull())
				} else {
					p.SetOver(!p.over)
				}
			case 7:
				if live[i] {
					n := len(recs[i]) + len(parked[i])
					b.Drop(p, n)
					pending -= n
					live[i], recs[i], parked[i] = false, nil, nil
				}
			}
			p.Sync()
			var want int64
			for j := range parts {
				if live[j] {
					for _, s := range recs[j] {
						want += s
					}
				}
			}
			if b.Bytes() != want || b.Pending() != pending {
				t.Fatalf("bytes %d pending %d, want %d and %d", b.Bytes(), b.Pending(), want, pending)
			}
			if p.Paused() != (p.held || p.overOwn || p.over) {
				t.Fatalf("synced partition: paused %v, held %v, over its share %v, waiting %v", p.Paused(), p.held, p.overOwn, p.over)
			}
		}
	})
}
