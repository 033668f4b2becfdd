package limit

import (
	"testing"
	"time"
)

func TestBreakerOpensOnlyAfterQuietWithoutSuccess(t *testing.T) {
	var b Breaker
	t0 := time.Unix(0, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	b.Done(ms(0), ms(0), false)
	if b.Watching() {
		t.Fatal("watching after a success")
	}
	b.Done(ms(0), ms(0), true)
	if !b.Watching() {
		t.Fatal("not watching after an overload signal: the next success's end time matters")
	}
	// A downstream short of capacity: rejections with successes between
	// never open it.
	for i := 1; i < 1000; i++ {
		b.Done(ms(i), ms(i), i%10 != 0)
		if b.Open() {
			t.Fatalf("opened at %dms with a success every 10ms", i)
		}
	}
	// An outage: nothing but overload after the last success, at 990ms.
	for i := 1000; i < 990+int(Quiet/time.Millisecond); i++ {
		b.Done(ms(i), ms(i), true)
		if b.Open() {
			t.Fatalf("opened at %dms, before Quiet without a success", i)
		}
	}
	if !b.Done(ms(990+int(Quiet/time.Millisecond)), ms(1240), true) || !b.Open() {
		t.Fatal("not open after Quiet of nothing but overload")
	}
}

func TestBreakerProbesWithGrowingPauses(t *testing.T) {
	var b Breaker
	now := time.Unix(0, 0)
	b.Done(now, now, true)
	now = now.Add(Quiet)
	b.Done(now, now, true) // opens for firstPause
	if ok, wait := b.Allow(now, 0); ok || wait != firstPause {
		t.Fatalf("just opened: ok %v, wait %v; want false, %v", ok, wait, firstPause)
	}
	// Attempts running when it opened fail too: they change nothing.
	if b.Done(now.Add(time.Millisecond), now.Add(-time.Millisecond), true) {
		t.Fatal("an attempt started before the opening changed the breaker")
	}
	var pauses []time.Duration
	probes := 0
	for range 12 {
		_, wait := b.Allow(now, 0)
		pauses = append(pauses, wait)
		now = now.Add(wait)
		if ok, _ := b.Allow(now, 0); !ok {
			t.Fatal("no probe allowed after the pause")
		}
		if ok, _ := b.Allow(now, 1); ok {
			t.Fatal("a second attempt allowed beside the probe")
		}
		probes++
		b.Done(now.Add(time.Millisecond), now, true) // the probe fails
		now = now.Add(time.Millisecond)
	}
	if last := pauses[len(pauses)-1]; last != MaxPause {
		t.Fatalf("pauses %v: want them to double up to %v", pauses, MaxPause)
	}
	if pauses[1] != 2*pauses[0] {
		t.Fatalf("pauses %v: want them to double", pauses)
	}
	// The downstream is back: the next probe succeeds and closes it.
	_, wait := b.Allow(now, 0)
	now = now.Add(wait)
	if !b.Done(now.Add(time.Millisecond), now, false) || b.Open() {
		t.Fatal("a successful probe did not close the breaker")
	}
	if ok, _ := b.Allow(now, 100); !ok {
		t.Fatal("closed, yet starts refused")
	}
}
