package kparprom

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDeadLetterRingKeepsTheNewestFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		max   int
		added int
		want  []int64 // offsets, newest first
	}{
		{"empty", 3, 0, []int64{}},
		{"partly filled", 3, 2, []int64{1, 0}},
		{"full", 3, 3, []int64{2, 1, 0}},
		{"wrapped", 3, 7, []int64{6, 5, 4}},
		{"keeps none", 0, 2, []int64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := deadLetterRing{max: tc.max}
			for i := range tc.added {
				r.add(DeadLetterEntry{Offset: int64(i)})
			}
			got := []int64{}
			for _, e := range r.list() {
				got = append(got, e.Offset)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("list() offsets = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("list() offsets = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestDeadLetterRingCutsLongErrorsOnARuneBoundary(t *testing.T) {
	r := deadLetterRing{max: 1}
	r.add(DeadLetterEntry{Error: strings.Repeat("é", maxErrorText)}) // 2 bytes each
	got := r.list()[0].Error
	if !utf8.ValidString(got) || len(got) > maxErrorText+len("…") || !strings.HasSuffix(got, "…") {
		t.Errorf("cut error = %d bytes, valid UTF-8 %v; want at most %d bytes ending in …", len(got), utf8.ValidString(got), maxErrorText+len("…"))
	}
}
