package sched

import (
	"math/rand/v2"
	"testing"
)

func TestQueueFIFO(t *testing.T) {
	var q Queue[int]
	ts := make([]Task[int], 5)
	for i := range ts {
		ts[i].Value = i
		q.Push(&ts[i])
	}
	if q.Len() != 5 {
		t.Fatalf("Len = %d, want 5", q.Len())
	}
	for i := range 5 {
		if got := q.Pop(); got == nil || got.Value != i {
			t.Fatalf("Pop %d = %v", i, got)
		}
	}
	if q.Pop() != nil || q.Len() != 0 {
		t.Fatal("queue not empty after popping everything")
	}
}

func TestLanesKeepOneInFlightPerKey(t *testing.T) {
	var l Lanes[int]
	ts := make([]Task[int], 6)
	keys := []uint64{1, 2, 1, 1, 2, 3}
	var ready []int
	for i := range ts {
		ts[i].Value = i
		if l.Admit(&ts[i], keys[i]) {
			ready = append(ready, i)
		}
	}
	if want := []int{0, 1, 5}; !equal(ready, want) {
		t.Fatalf("ready after admit = %v, want %v", ready, want)
	}
	if l.Busy() != 3 || l.Parked() != 3 {
		t.Fatalf("Busy, Parked = %d, %d; want 3, 3", l.Busy(), l.Parked())
	}
	// Key 1 releases in admission order: 0 -> 2 -> 3.
	if next := l.Release(&ts[0]); next != &ts[2] {
		t.Fatalf("Release(0) = %v, want task 2", next)
	}
	if next := l.TakeNext(&ts[2]); next != &ts[3] {
		t.Fatalf("TakeNext(2) = %v, want task 3", next)
	}
	if next := l.Release(&ts[3]); next != nil {
		t.Fatalf("Release(3) = %v, want nil (lane idle)", next)
	}
	if next := l.Release(&ts[5]); next != nil {
		t.Fatalf("Release(5) = %v, want nil", next)
	}
	if next := l.Release(&ts[1]); next != &ts[4] {
		t.Fatalf("Release(1) = %v, want task 4", next)
	}
	l.Release(&ts[4])
	if l.Busy() != 0 {
		t.Fatalf("Busy = %d after releasing all, want 0", l.Busy())
	}
	// A recycled lane starts empty.
	if !l.Admit(&ts[0], 9) {
		t.Fatal("Admit on a fresh key after recycling did not report ready")
	}
}

func TestLanesSteadyStateDoesNotAllocate(t *testing.T) {
	var l Lanes[int]
	ts := make([]Task[int], 2)
	l.Admit(&ts[0], 1)
	l.Release(&ts[0])
	allocs := testing.AllocsPerRun(1000, func() {
		l.Admit(&ts[0], 7)
		l.Admit(&ts[1], 7)
		l.Release(l.Release(&ts[0]))
	})
	if allocs != 0 {
		t.Fatalf("allocs per admit/release cycle = %v, want 0", allocs)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLanesMatchAModel drives Lanes with random admits and releases over a
// small key space (so probe runs collide and wrap) and checks every answer
// against a map of FIFOs.
func TestLanesMatchAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var l Lanes[int]
	model := map[uint32][]*Task[int]{} // lane key -> in-flight task, then parked ones
	var inflight []*Task[int]
	for step := range 200_000 {
		if len(inflight) == 0 || rng.IntN(2) == 0 {
			// Keys share low bits often: many collide in the table.
			raw := uint64(rng.IntN(64)) << uint(rng.IntN(3)*20)
			key := laneKey(raw)
			task := &Task[int]{Value: step}
			ready := l.Admit(task, raw)
			if wantReady := len(model[key]) == 0; ready != wantReady {
				t.Fatalf("step %d: Admit(key %x) ready = %v, want %v", step, key, ready, wantReady)
			}
			model[key] = append(model[key], task)
			if ready {
				inflight = append(inflight, task)
			}
			continue
		}
		i := rng.IntN(len(inflight))
		task := inflight[i]
		inflight = append(inflight[:i], inflight[i+1:]...)
		q := model[task.lane][1:]
		var want *Task[int]
		if len(q) > 0 {
			want = q[0]
			inflight = append(inflight, want)
			model[task.lane] = q
		} else {
			delete(model, task.lane)
		}
		if got := l.Release(task); got != want {
			t.Fatalf("step %d: Release returned %v, want %v", step, got, want)
		}
		if l.Busy() != len(model) {
			t.Fatalf("step %d: Busy = %d, want %d", step, l.Busy(), len(model))
		}
	}
}

// BenchmarkLanesDistinctKeys is key mode when keys rarely repeat: each task
// creates its lane and deletes it on release, with ~1,000 lanes busy.
func BenchmarkLanesDistinctKeys(b *testing.B) {
	const busy = 1000
	var l Lanes[int]
	tasks := make([]Task[int], busy)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range tasks {
		l.Admit(&tasks[i], rng.Uint64())
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t := &tasks[i%busy]
		l.Release(t)
		l.Admit(t, rng.Uint64())
	}
}

// TestTakeNextPassesTheTurn: a batch of one lane's tasks, each released
// in turn, makes the lane's next task ready once, after the last.
func TestTakeNextPassesTheTurn(t *testing.T) {
	var l Lanes[int]
	ts := make([]Task[int], 4)
	for i := range ts {
		l.Admit(&ts[i], 7)
	}
	if l.TakeNext(&ts[0]) != &ts[1] || l.TakeNext(&ts[1]) != &ts[2] {
		t.Fatal("TakeNext does not take the lane's parked tasks in order")
	}
	for i := range 2 {
		if next := l.Release(&ts[i]); next != nil {
			t.Fatalf("Release(%d) = task %d: a batch's earlier task handed the lane on", i, next.Value)
		}
	}
	if next := l.Release(&ts[2]); next != &ts[3] {
		t.Fatalf("Release(2) = %v, want task 3", next)
	}
	if next := l.Release(&ts[3]); next != nil || l.Busy() != 0 {
		t.Fatalf("Release(3) = %v, busy %d; want nil, 0", next, l.Busy())
	}
}

// TestGiveBackRestoresTheLane: the tasks of a failed batch go back in
// front of the lane, in order, behind the batch's first task.
func TestGiveBackRestoresTheLane(t *testing.T) {
	var l Lanes[int]
	ts := make([]Task[int], 5)
	for i := range ts {
		l.Admit(&ts[i], 7)
	}
	taken := []*Task[int]{l.TakeNext(&ts[0])}
	taken = append(taken, l.TakeNext(taken[0]))
	l.GiveBack(&ts[0], taken)
	if l.Parked() != 4 {
		t.Fatalf("Parked = %d after GiveBack, want 4", l.Parked())
	}
	for want := 1; want < len(ts); want++ {
		if next := l.Release(&ts[want-1]); next != &ts[want] {
			t.Fatalf("Release(%d) = %v, want task %d", want-1, next, want)
		}
	}
	if next := l.Release(&ts[4]); next != nil || l.Busy() != 0 {
		t.Fatalf("Release(4) = %v, busy %d; want nil, 0", next, l.Busy())
	}
}

// TestWideLaneOrdersEveryKeyAndSplitsOntoKeyLanes: the wide lane runs its
// tasks one after another whatever their keys; Split moves the running
// one onto its key's lane and the parked ones onto theirs, in order, so a
// parked task of the running one's key still waits for it.
func TestWideLaneOrdersEveryKeyAndSplitsOntoKeyLanes(t *testing.T) {
	var l Lanes[int]
	ts := make([]Task[int], 6)
	keys := []uint64{1, 2, 1, 3, 2, 1}
	for i := range ts {
		ts[i].Value = i
		if got := l.AdmitWide(&ts[i]); got != (i == 0) {
			t.Fatalf("AdmitWide(%d) = %v, want %v", i, got, i == 0)
		}
	}
	if l.Busy() != 1 || l.Parked() != 5 || l.WideParked() != 5 {
		t.Fatalf("Busy, Parked, WideParked = %d, %d, %d; want 1, 5, 5", l.Busy(), l.Parked(), l.WideParked())
	}
	if next := l.Release(&ts[0]); next != &ts[1] {
		t.Fatalf("Release(0) = %v, want task 1, whatever its key", next)
	}
	if l.TakeNext(&ts[1]) != nil {
		t.Fatal("TakeNext on the wide lane: want nil, batches do not take from it")
	}

	// Task 1 (key 2) runs; 2 (key 1), 3 (key 3), 4 (key 2), 5 (key 1) wait.
	var ready []int
	l.Split(func(t *Task[int]) (uint64, bool) { return keys[t.Value], true }, func(t *Task[int]) { ready = append(ready, t.Value) })
	if want := []int{2, 3}; !equal(ready, want) {
		t.Fatalf("ready after Split = %v, want %v: 4 waits for 1 (key 2), 5 for 2 (key 1)", ready, want)
	}
	if l.WideParked() != 0 || l.Busy() != 3 || l.Parked() != 2 {
		t.Fatalf("after Split: WideParked, Busy, Parked = %d, %d, %d; want 0, 3, 2", l.WideParked(), l.Busy(), l.Parked())
	}
	for i := range ts {
		if ts[i].Wide() {
			t.Fatalf("task %d still on the wide lane after Split", i)
		}
	}
	if next := l.Release(&ts[1]); next != &ts[4] {
		t.Fatalf("Release(1) = %v, want task 4, its key's next", next)
	}
	if next := l.Release(&ts[2]); next != &ts[5] {
		t.Fatalf("Release(2) = %v, want task 5, its key's next", next)
	}
	for _, i := range []int{3, 4, 5} {
		if next := l.Release(&ts[i]); next != nil {
			t.Fatalf("Release(%d) = %v, want nil", i, next)
		}
	}
	if l.Busy() != 0 || l.Parked() != 0 {
		t.Fatalf("Busy, Parked = %d, %d; want 0, 0", l.Busy(), l.Parked())
	}

	// An idle wide lane opens again; Split of an idle lane does nothing.
	l.Split(func(*Task[int]) (uint64, bool) { return 1, true }, func(*Task[int]) { t.Fatal("Split of an idle wide lane made a task ready") })
	var again Task[int]
	if !l.AdmitWide(&again) || l.Release(&again) != nil || l.Busy() != 0 {
		t.Fatal("a wide lane admitted again after it went idle: want it idle once its task is released")
	}
}

// TestWideLaneSplitsOutOfTheLanes: tasks that need no lane (unordered
// ones) leave the lanes on Split, the parked ones ready at once.
func TestWideLaneSplitsOutOfTheLanes(t *testing.T) {
	var l Lanes[int]
	ts := make([]Task[int], 3)
	for i := range ts {
		ts[i].Value = i
		l.AdmitWide(&ts[i])
	}
	var ready []int
	l.Split(func(*Task[int]) (uint64, bool) { return 0, false }, func(t *Task[int]) { ready = append(ready, t.Value) })
	if want := []int{1, 2}; !equal(ready, want) {
		t.Fatalf("ready after Split = %v, want %v", ready, want)
	}
	if l.Busy() != 0 || l.Parked() != 0 {
		t.Fatalf("Busy, Parked = %d, %d; want 0, 0: no lane holds an unordered task", l.Busy(), l.Parked())
	}
	for i := range ts {
		if next := l.Release(&ts[i]); next != nil {
			t.Fatalf("Release(%d) = %v, want nil", i, next)
		}
	}
}

// TestExpandWidePlacesEachTasksRecordsRightBehindIt: tasks standing for
// several records give some back as tasks of their own, which the wide
// lane then orders right behind the task they came from, the in-flight
// one included.
func TestExpandWidePlacesEachTasksRecordsRightBehindIt(t *testing.T) {
	var l Lanes[int]
	ts := make([]Task[int], 3)    // 0 in flight, 1 and 2 parked
	extra := make([]Task[int], 4) // 10, 11 behind 0; 20 behind 1; 21 behind 2
	for i := range ts {
		ts[i].Value = i
		l.AdmitWide(&ts[i])
	}
	for i, v := range []int{10, 11, 20, 21} {
		extra[i].Value = v
	}
	l.ExpandWide(func(t *Task[int]) []*Task[int] {
		switch t.Value {
		case 0:
			return []*Task[int]{&extra[0], &extra[1]}
		case 1:
			return []*Task[int]{&extra[2]}
		case 2:
			return []*Task[int]{&extra[3]}
		}
		return nil
	})
	if l.WideParked() != 6 {
		t.Fatalf("WideParked = %d, want 6", l.WideParked())
	}
	var order []int
	for cur := &ts[0]; cur != nil; cur = l.Release(cur) {
		if !cur.Wide() {
			t.Fatalf("task %d is not on the wide lane", cur.Value)
		}
		order = append(order, cur.Value)
	}
	if want := []int{0, 10, 11, 1, 20, 2, 21}; !equal(order, want) {
		t.Fatalf("wide lane order = %v, want %v", order, want)
	}
}

// TestReplaceHandsTheTurnOver: a task replaced in flight gives its turn to
// the new task; on the wide lane the front tasks wait right behind it,
// before the tasks parked there already; on a key lane the replacement
// releases the lane as its predecessor would have.
func TestReplaceHandsTheTurnOver(t *testing.T) {
	t.Run("wide", func(t *testing.T) {
		var l Lanes[int]
		old, parked, repl := &Task[int]{Value: 0}, &Task[int]{Value: 9}, &Task[int]{Value: 1}
		front := []*Task[int]{{Value: 2}, {Value: 3}}
		l.AdmitWide(old)
		l.AdmitWide(parked)
		l.Replace(old, repl, front)
		if old.Wide() || l.Release(old) != nil {
			t.Fatal("the replaced task still holds the wide lane")
		}
		var order []int
		for cur := repl; cur != nil; cur = l.Release(cur) {
			order = append(order, cur.Value)
		}
		if want := []int{1, 2, 3, 9}; !equal(order, want) {
			t.Fatalf("wide lane order = %v, want %v", order, want)
		}
		if l.Busy() != 0 {
			t.Fatalf("Busy = %d after the lane drained", l.Busy())
		}
	})
	t.Run("key", func(t *testing.T) {
		var l Lanes[int]
		old, parked, repl := &Task[int]{Value: 0}, &Task[int]{Value: 9}, &Task[int]{Value: 1}
		l.Admit(old, 7)
		l.Admit(parked, 7)
		l.Replace(old, repl, nil)
		if next := l.Release(repl); next != parked {
			t.Fatalf("Release(replacement) = %v, want the parked task", next)
		}
		if l.Release(parked) != nil || l.Busy() != 0 {
			t.Fatal("the key lane did not drain")
		}
	})
}

// TestWithdrawTakesParkedTasksOut: Withdraw hands out the parked tasks it
// does not keep, in lane order, and leaves the tasks in flight and the kept
// ones where they were.
func TestWithdrawTakesParkedTasksOut(t *testing.T) {
	var l Lanes[int]
	mk := func(v int) *Task[int] { return &Task[int]{Value: v} }
	wide, wideNext := mk(1), mk(2)
	l.AdmitWide(wide)
	l.AdmitWide(wideNext)
	a, a2, a3 := mk(10), mk(11), mk(12)
	l.Admit(a, 7)
	l.Admit(a2, 7)
	l.Admit(a3, 7)
	var out []int
	l.Withdraw(func(t *Task[int]) bool { return t.Value == 12 }, func(t *Task[int]) { out = append(out, t.Value) })
	if len(out) != 2 || out[0] != 2 || out[1] != 11 {
		t.Fatalf("withdrew %v, want [2 11]", out)
	}
	if l.Release(wideNext) != nil || l.Release(a2) != nil {
		t.Fatal("a withdrawn task still holds a place in its lane")
	}
	if next := l.Release(wide); next != nil {
		t.Fatalf("the wide lane hands over %v after its parked task was withdrawn, want nothing", next.Value)
	}
	if next := l.Release(a); next != a3 {
		t.Fatal("the kept task did not keep its place behind its lane's task in flight")
	}
}
