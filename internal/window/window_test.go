package window

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// state is the observable state of a Window at one point.
type state struct {
	start         int64
	ok            bool
	len, pending  int
	finishedAbove []int64
	end           int64
}

func observe(w *Window) state {
	start, ok := w.Start()
	return state{
		start:         start,
		ok:            ok,
		len:           w.Len(),
		pending:       w.Pending(),
		finishedAbove: w.AppendFinishedAbove(nil, 1<<30),
		end:           w.End(),
	}
}

func checkState(t *testing.T, w *Window, want state) {
	t.Helper()
	got := observe(w)
	if got.start != want.start || got.ok != want.ok {
		t.Errorf("Start() = %d, %v; want %d, %v", got.start, got.ok, want.start, want.ok)
	}
	if got.len != want.len {
		t.Errorf("Len() = %d; want %d", got.len, want.len)
	}
	if got.pending != want.pending {
		t.Errorf("Pending() = %d; want %d", got.pending, want.pending)
	}
	if fa := w.FinishedAbove(); fa != len(want.finishedAbove) {
		t.Errorf("FinishedAbove() = %d; want %d", fa, len(want.finishedAbove))
	}
	if !slices.Equal(got.finishedAbove, want.finishedAbove) {
		t.Errorf("AppendFinishedAbove() = %v; want %v", got.finishedAbove, want.finishedAbove)
	}
	if got.end != want.end {
		t.Errorf("End() = %d; want %d", got.end, want.end)
	}
}

// step is one Done call and the window state expected after it.
type step struct {
	done  Seq
	moved bool
	want  state
}

type scenario struct {
	name    string
	offsets []int64
	steps   []step
}

func runScenarios(t *testing.T, scenarios []scenario) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			w := New(4)
			for i, o := range sc.offsets {
				if s := w.Push(o); s != Seq(i) {
					t.Fatalf("Push(%d) = seq %d; want %d", o, s, i)
				}
			}
			for i, st := range sc.steps {
				if moved := w.Done(st.done); moved != st.moved {
					t.Errorf("step %d: Done(%d) = %v; want %v", i, st.done, moved, st.moved)
				}
				checkState(t, w, st.want)
				if t.Failed() {
					t.FailNow()
				}
			}
		})
	}
}

func TestWindowStartBeforePush(t *testing.T) {
	w := New(0)
	checkState(t, w, state{end: -1})
	if got := w.AppendFinishedAbove([]int64{7}, 10); !slices.Equal(got, []int64{7}) {
		t.Errorf("AppendFinishedAbove on empty window = %v; want [7]", got)
	}
}

func TestWindowPushOnly(t *testing.T) {
	w := New(2)
	w.Push(100)
	checkState(t, w, state{start: 100, ok: true, len: 1, pending: 1, end: 101})
	w.Push(101)
	w.Push(200)
	checkState(t, w, state{start: 100, ok: true, len: 3, pending: 3, end: 201})
}

func TestWindowInOrderCompletion(t *testing.T) {
	runScenarios(t, []scenario{{
		name:    "contiguous",
		offsets: []int64{10, 11, 12},
		steps: []step{
			{0, true, state{start: 11, ok: true, len: 2, pending: 2, end: 13}},
			{1, true, state{start: 12, ok: true, len: 1, pending: 1, end: 13}},
			{2, true, state{start: 13, ok: true, end: 13}},
		},
	}, {
		name:    "single",
		offsets: []int64{0},
		steps: []step{
			{0, true, state{start: 1, ok: true, end: 1}},
		},
	}})
}

func TestWindowOutOfOrderCompletion(t *testing.T) {
	runScenarios(t, []scenario{{
		name:    "middle first",
		offsets: []int64{0, 1, 2, 3},
		steps: []step{
			{2, false, state{start: 0, ok: true, len: 4, pending: 3, finishedAbove: []int64{2}, end: 4}},
			{1, false, state{start: 0, ok: true, len: 4, pending: 2, finishedAbove: []int64{1, 2}, end: 4}},
			{0, true, state{start: 3, ok: true, len: 1, pending: 1, end: 4}},
			{3, true, state{start: 4, ok: true, end: 4}},
		},
	}, {
		name:    "last first",
		offsets: []int64{5, 6, 7},
		steps: []step{
			{2, false, state{start: 5, ok: true, len: 3, pending: 2, finishedAbove: []int64{7}, end: 8}},
			{0, true, state{start: 6, ok: true, len: 2, pending: 1, finishedAbove: []int64{7}, end: 8}},
			{1, true, state{start: 8, ok: true, end: 8}},
		},
	}})
}

func TestWindowReverseCompletion(t *testing.T) {
	runScenarios(t, []scenario{{
		name:    "reverse",
		offsets: []int64{0, 1, 2, 3, 4},
		steps: []step{
			{4, false, state{start: 0, ok: true, len: 5, pending: 4, finishedAbove: []int64{4}, end: 5}},
			{3, false, state{start: 0, ok: true, len: 5, pending: 3, finishedAbove: []int64{3, 4}, end: 5}},
			{2, false, state{start: 0, ok: true, len: 5, pending: 2, finishedAbove: []int64{2, 3, 4}, end: 5}},
			{1, false, state{start: 0, ok: true, len: 5, pending: 1, finishedAbove: []int64{1, 2, 3, 4}, end: 5}},
			{0, true, state{start: 5, ok: true, end: 5}},
		},
	}})
}

func TestWindowGapsDoNotStall(t *testing.T) {
	runScenarios(t, []scenario{{
		name:    "in order",
		offsets: []int64{0, 1, 5, 9, 10},
		steps: []step{
			{0, true, state{start: 1, ok: true, len: 4, pending: 4, end: 11}},
			{1, true, state{start: 5, ok: true, len: 3, pending: 3, end: 11}},
			{2, true, state{start: 9, ok: true, len: 2, pending: 2, end: 11}},
			{3, true, state{start: 10, ok: true, len: 1, pending: 1, end: 11}},
			{4, true, state{start: 11, ok: true, end: 11}},
		},
	}, {
		name:    "out of order across gaps",
		offsets: []int64{0, 1, 5, 9, 10},
		steps: []step{
			{3, false, state{start: 0, ok: true, len: 5, pending: 4, finishedAbove: []int64{9}, end: 11}},
			{2, false, state{start: 0, ok: true, len: 5, pending: 3, finishedAbove: []int64{5, 9}, end: 11}},
			{1, false, state{start: 0, ok: true, len: 5, pending: 2, finishedAbove: []int64{1, 5, 9}, end: 11}},
			// Offsets 2-4 and 6-8 were never fetched; they must not hold the start back.
			{0, true, state{start: 10, ok: true, len: 1, pending: 1, end: 11}},
			{4, true, state{start: 11, ok: true, end: 11}},
		},
	}, {
		name:    "huge gap",
		offsets: []int64{3, 1 << 40},
		steps: []step{
			{0, true, state{start: 1 << 40, ok: true, len: 1, pending: 1, end: 1<<40 + 1}},
			{1, true, state{start: 1<<40 + 1, ok: true, end: 1<<40 + 1}},
		},
	}})
}

func TestWindowDuplicateDoneIsNoop(t *testing.T) {
	runScenarios(t, []scenario{{
		name:    "above start",
		offsets: []int64{0, 1, 2},
		steps: []step{
			{1, false, state{start: 0, ok: true, len: 3, pending: 2, finishedAbove: []int64{1}, end: 3}},
			{1, false, state{start: 0, ok: true, len: 3, pending: 2, finishedAbove: []int64{1}, end: 3}},
		},
	}, {
		name:    "below start",
		offsets: []int64{0, 1, 2},
		steps: []step{
			{0, true, state{start: 1, ok: true, len: 2, pending: 2, end: 3}},
			{0, false, state{start: 1, ok: true, len: 2, pending: 2, end: 3}},
		},
	}, {
		name:    "all finished",
		offsets: []int64{0, 1},
		steps: []step{
			{1, false, state{start: 0, ok: true, len: 2, pending: 1, finishedAbove: []int64{1}, end: 2}},
			{0, true, state{start: 2, ok: true, end: 2}},
			{1, false, state{start: 2, ok: true, end: 2}},
			{0, false, state{start: 2, ok: true, end: 2}},
		},
	}})
}

func TestWindowGrowsPastSizeHint(t *testing.T) {
	for _, hint := range []int{-1, 0, 1, 3, 8, 9, 100} {
		w := New(hint)
		const n = 1000
		// Finish entry 1 early so that finished entries are carried through growth.
		for i := range n {
			w.Push(int64(3 * i))
			if i == 1 {
				w.Done(1)
			}
		}
		if w.Len() != n || w.Pending() != n-1 || w.FinishedAbove() != 1 {
			t.Fatalf("hint %d: Len, Pending, FinishedAbove = %d, %d, %d; want %d, %d, 1",
				hint, w.Len(), w.Pending(), w.FinishedAbove(), n, n-1)
		}
		if got := w.AppendFinishedAbove(nil, 10); !slices.Equal(got, []int64{3}) {
			t.Fatalf("hint %d: AppendFinishedAbove = %v; want [3]", hint, got)
		}
		for i := n - 1; i >= 0; i-- {
			if start, _ := w.Start(); start != 0 {
				t.Fatalf("hint %d: Start() = %d before Done(0); want 0", hint, start)
			}
			moved := w.Done(Seq(i))
			if moved != (i == 0) {
				t.Fatalf("hint %d: Done(%d) = %v", hint, i, moved)
			}
		}
		checkState(t, w, state{start: 3*(n-1) + 1, ok: true, end: 3*(n-1) + 1})
	}
}

func TestWindowWrapsAroundManyTimes(t *testing.T) {
	w := New(8)
	capBefore := len(w.ring)
	var offset int64
	var seqs []Seq
	// Keep 5 entries in flight, finishing the second-oldest first each round, so
	// live entries straddle the ring boundary at every position.
	for round := range 10_000 {
		for len(seqs) < 5 {
			offset += int64(1 + round%3)
			seqs = append(seqs, w.Push(offset))
		}
		if w.Done(seqs[1]) {
			t.Fatalf("round %d: Done of second-oldest moved the start", round)
		}
		first, _ := w.Start()
		if !w.Done(seqs[0]) {
			t.Fatalf("round %d: Done of oldest did not move the start", round)
		}
		if next, _ := w.Start(); next <= first {
			t.Fatalf("round %d: start went from %d to %d", round, first, next)
		}
		seqs = seqs[2:]
		if w.Len() != 3 || w.Pending() != 3 {
			t.Fatalf("round %d: Len, Pending = %d, %d; want 3, 3", round, w.Len(), w.Pending())
		}
	}
	if len(w.ring) != capBefore {
		t.Errorf("ring grew from %d to %d although at most 5 entries were in flight", capBefore, len(w.ring))
	}
}

func TestWindowAppendFinishedAboveMax(t *testing.T) {
	w := New(8)
	for i := range 6 {
		w.Push(int64(10 * i))
	}
	for _, s := range []Seq{1, 3, 4, 5} {
		w.Done(s)
	}
	for _, tc := range []struct {
		max  int
		want []int64
	}{
		{-1, nil},
		{0, nil},
		{1, []int64{10}},
		{3, []int64{10, 30, 40}},
		{4, []int64{10, 30, 40, 50}},
		{100, []int64{10, 30, 40, 50}},
	} {
		got := w.AppendFinishedAbove([]int64{-7}, tc.max)
		if want := append([]int64{-7}, tc.want...); !slices.Equal(got, want) {
			t.Errorf("AppendFinishedAbove(max=%d) = %v; want %v", tc.max, got, want)
		}
	}
}

func TestWindowPanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func(w *Window)
		msg  string
	}{
		{"push repeated offset", func(w *Window) { w.Push(5); w.Push(5) }, "not above last pushed offset 5"},
		{"push backwards", func(w *Window) { w.Push(5); w.Push(4) }, "Push(4) not above"},
		{"push negative", func(w *Window) { w.Push(-1) }, "Push(-1): negative offset"},
		{"done never pushed", func(w *Window) { w.Done(0) }, "never pushed"},
		{"done beyond tail", func(w *Window) { w.Push(1); w.Done(0); w.Done(1) }, "never pushed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				msg, _ := r.(string)
				if !strings.Contains(msg, tc.msg) {
					t.Errorf("panic = %v; want message containing %q", r, tc.msg)
				}
			}()
			tc.fn(New(4))
		})
	}
}

func TestWindowSteadyStateDoesNotAllocate(t *testing.T) {
	w := New(16)
	var offset int64
	var seqs [8]Seq
	for i := range seqs {
		offset++
		seqs[i] = w.Push(offset)
	}
	buf := make([]int64, 0, 16)
	var i int
	allocs := testing.AllocsPerRun(10_000, func() {
		// Finish out of order: every other slot is delayed by one round.
		j := (i * 5) % len(seqs)
		w.Done(seqs[j])
		offset += 2
		seqs[j] = w.Push(offset)
		w.Start()
		buf = w.AppendFinishedAbove(buf[:0], cap(buf))
		i++
	})
	if allocs != 0 {
		t.Errorf("steady state allocates %v times per op; want 0", allocs)
	}
}

func TestEachFinishedRunSpansGaps(t *testing.T) {
	w := New(8)
	// Offsets 10..16 with 13 compacted away.
	var seqs []Seq
	for _, o := range []int64{10, 11, 12, 14, 15, 16, 20} {
		seqs = append(seqs, w.Push(o))
	}
	for _, i := range []int{1, 2, 3, 4, 6} { // 11, 12, 14, 15, 20 done; 10 and 16 not
		w.Done(seqs[i])
	}
	var got [][2]int64
	w.EachFinishedRun(func(from, to int64) { got = append(got, [2]int64{from, to}) })
	want := [][2]int64{{11, 16}, {20, 21}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
}

// TestAcquiredWindowTakesAnyOrder: a share group member's window takes
// offsets in any order, repeats included, and its start is the oldest
// unfinished entry's offset.
func TestAcquiredWindowTakesAnyOrder(t *testing.T) {
	w := NewAcquired(4)
	a, b, c := w.Push(10), w.Push(3), w.Push(10)
	if off, _ := w.Start(); off != 10 {
		t.Fatalf("Start = %d, want 10 (the oldest entry)", off)
	}
	w.Done(a)
	if off, _ := w.Start(); off != 3 {
		t.Fatalf("Start = %d, want 3", off)
	}
	w.Done(c)
	w.Done(b)
	if w.Pending() != 0 || w.Len() != 0 {
		t.Fatalf("Pending %d, Len %d; want an empty window", w.Pending(), w.Len())
	}
}
