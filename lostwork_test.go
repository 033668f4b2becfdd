package kpar

import (
	"slices"
	"testing"

	"github.com/kpar/kpar/internal/offsetmeta"
)

// TestLostWorkJoinsTheCommittedFinishedSet: what a member finished on a
// partition it lost joins the finished set of the commit metadata when the
// partition comes back, above the committed offset only, and only once.
func TestLostWorkJoinsTheCommittedFinishedSet(t *testing.T) {
	k := tp{topic: "t", partition: 1}
	var l lostWork
	l.keep(k, []offsetmeta.Run{{From: 100, To: 250}, {From: 260, To: 270}})
	meta := []offsetmeta.Run{{From: 121, To: 130}, {From: 280, To: 290}}
	got := l.take(k, meta, 120)
	want := []offsetmeta.Run{{From: 120, To: 250}, {From: 260, To: 270}, {From: 280, To: 290}}
	if !slices.Equal(got, want) {
		t.Errorf("take = %v, want %v", got, want)
	}
	if got := l.take(k, meta, 120); !slices.Equal(got, meta) {
		t.Errorf("second take = %v, want the metadata's %v alone", got, meta)
	}
	l.keep(k, []offsetmeta.Run{{From: 0, To: 10}})
	l.forget("t")
	if got := l.take(k, nil, 0); got != nil {
		t.Errorf("take after forget = %v, want nothing", got)
	}
	l.keep(k, []offsetmeta.Run{{From: 0, To: 10}})
	if got := l.take(k, nil, 50); len(got) != 0 {
		t.Errorf("take above what was kept = %v, want nothing", got)
	}
}
