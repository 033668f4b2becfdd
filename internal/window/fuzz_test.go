package window

import (
	"slices"
	"testing"
)

// model is a trivially correct window: every pushed entry, indexed by seq, and
// the index of the lowest unfinished one found by scanning.
type model struct {
	offsets []int64
	done    []bool
	first   int // every seq below first is done
}

func (m *model) finish(s int) {
	m.done[s] = true
	for m.first < len(m.done) && m.done[m.first] {
		m.first++
	}
}

func (m *model) start() (int64, bool) {
	if m.first < len(m.offsets) {
		return m.offsets[m.first], true
	}
	if len(m.offsets) == 0 {
		return 0, false
	}
	return m.offsets[len(m.offsets)-1] + 1, true
}

// counts returns the model's Len, Pending and finished offsets above the start.
func (m *model) counts() (length, pending int, finishedAbove []int64) {
	for i := m.first; i < len(m.done); i++ {
		if m.done[i] {
			finishedAbove = append(finishedAbove, m.offsets[i])
		} else {
			pending++
		}
	}
	return len(m.done) - m.first, pending, finishedAbove
}

// FuzzWindow drives a Window and the model with the same operations, decoded one
// byte each:
//
//	xxxxx0gg  push, offset = last + 1 + gap, gap = 0, 1, 5 or 1000 by gg
//	xxxxxx01  Done of the (x mod n)th unfinished seq
//	xxxxxx11  Done of the (x mod n)th most recently pushed seq, finished or not
//
// and checks after every operation that both agree and that the commit point
// never passes an unfinished offset. The first byte picks the size hint.
func FuzzWindow(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 1, 1})
	f.Add([]byte{1, 0, 4, 8, 0x0c, 0x13, 0x07, 0x03, 0x01})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x05, 0x09, 0x0d, 0x01, 0x03, 0x03, 0x01, 0x01})
	f.Add([]byte{8, 3, 2, 1, 0, 0x0f, 0x0b, 0x07, 0x03, 0x01, 0x01, 0x01, 0x01})
	f.Add([]byte{0, 0, 0x01, 0, 0x01, 0, 0x01, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x21, 0x41, 0x01})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) == 0 || len(ops) > 4096 {
			return // the model is quadratic; long inputs add time, not coverage
		}
		w := New(int(ops[0] % 32))
		var m model
		last := int64(-1)
		gaps := [4]int64{0, 1, 5, 1000}
		var pendingSeqs []int // scratch
		for i, op := range ops[1:] {
			switch {
			case op&1 == 0:
				offset := last + 1 + gaps[op>>1&3]
				last = offset
				if s := w.Push(offset); s != Seq(len(m.offsets)) {
					t.Fatalf("op %d: Push(%d) = seq %d; want %d", i, offset, s, len(m.offsets))
				}
				m.offsets = append(m.offsets, offset)
				m.done = append(m.done, false)
			default:
				if len(m.offsets) == 0 {
					continue
				}
				var s int
				if op&2 == 0 {
					pendingSeqs = pendingSeqs[:0]
					for j := m.first; j < len(m.done); j++ {
						if !m.done[j] {
							pendingSeqs = append(pendingSeqs, j)
						}
					}
					if len(pendingSeqs) == 0 {
						continue
					}
					s = pendingSeqs[int(op>>2)%len(pendingSeqs)]
				} else {
					s = len(m.offsets) - 1 - int(op>>2)%len(m.offsets)
				}
				before, _ := m.start()
				m.finish(s)
				after, _ := m.start()
				if moved := w.Done(Seq(s)); moved != (after != before) {
					t.Fatalf("op %d: Done(%d) = %v; model start %d -> %d", i, s, moved, before, after)
				}
			}

			start, ok := w.Start()
			wantStart, wantOK := m.start()
			if start != wantStart || ok != wantOK {
				t.Fatalf("op %d: Start() = %d, %v; want %d, %v", i, start, ok, wantStart, wantOK)
			}
			for j, d := range m.done {
				if !d && start > m.offsets[j] {
					t.Fatalf("op %d: commit point %d passes unfinished offset %d", i, start, m.offsets[j])
				}
			}
			length, pending, finished := m.counts()
			if w.Len() != length || w.Pending() != pending || w.FinishedAbove() != len(finished) {
				t.Fatalf("op %d: Len, Pending, FinishedAbove = %d, %d, %d; want %d, %d, %d",
					i, w.Len(), w.Pending(), w.FinishedAbove(), length, pending, len(finished))
			}
			if got := w.AppendFinishedAbove(nil, len(finished)+1); !slices.Equal(got, finished) {
				t.Fatalf("op %d: AppendFinishedAbove = %v; want %v", i, got, finished)
			}
			if len(finished) > 1 {
				if got := w.AppendFinishedAbove(nil, 1); !slices.Equal(got, finished[:1]) {
					t.Fatalf("op %d: AppendFinishedAbove(max 1) = %v; want %v", i, got, finished[:1])
				}
			}
			wantEnd := int64(-1)
			if len(m.offsets) > 0 {
				wantEnd = last + 1
			}
			if w.End() != wantEnd {
				t.Fatalf("op %d: End() = %d; want %d", i, w.End(), wantEnd)
			}
		}
	})
}
