package retry

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestARecordForgottenBeforeItsTimerFiresIsNotDue(t *testing.T) {
	r := New[int, string]()
	r.Wait(1, "timer-1")
	r.Wait(2, "timer-2")
	var stopped []string
	r.Forget(func(t int) bool { return t == 1 }, func(_ int, w string) { stopped = append(stopped, w) })
	if !slices.Equal(stopped, []string{"timer-1"}) || r.Waiting() != 1 {
		t.Fatalf("forgot %v, %d waiting; want timer-1 forgotten and one waiting", stopped, r.Waiting())
	}
	if r.Due(1) {
		t.Fatal("a forgotten record's timer fired and it was due all the same")
	}
	if !r.Due(2) || r.Due(2) || r.Waiting() != 0 {
		t.Fatal("a waiting record's timer fired: want it due once, then nothing waiting")
	}
}

func TestForgetWithoutMatchTakesEveryRecord(t *testing.T) {
	r := New[int, int]()
	for i := range 5 {
		r.Wait(i, i*10)
	}
	n := 0
	r.Forget(nil, func(int, int) { n++ })
	if n != 5 || r.Waiting() != 0 {
		t.Fatalf("forgot %d, %d waiting; want all 5 forgotten", n, r.Waiting())
	}
}

func TestTheExileQueueIsTakenWholeInOrder(t *testing.T) {
	r := New[int, int]()
	r.Exile(3)
	r.Exile(1)
	r.Exile(2)
	if got := r.TakeExiled(); !slices.Equal(got, []int{3, 1, 2}) {
		t.Fatalf("took %v, want [3 1 2]", got)
	}
	if got := r.TakeExiled(); len(got) != 0 {
		t.Fatalf("took %v from an empty queue", got)
	}
}

func TestFindLooksAtWaitingAndExiledRecords(t *testing.T) {
	r := New[int, int]()
	r.Wait(7, 0)
	r.Exile(9)
	for _, want := range []int{7, 9} {
		if got, ok := r.Find(func(t int) bool { return t == want }); !ok || got != want {
			t.Fatalf("find %d: %d, %v", want, got, ok)
		}
	}
	if _, ok := r.Find(func(t int) bool { return t == 8 }); ok {
		t.Fatal("found a record that neither waits nor is exiled")
	}
}

func TestRetryTopicsAreNamedAndReadBack(t *testing.T) {
	tp := NewTopics([]string{"orders", "a.retry.x"}, 2, time.Second)
	if got := tp.Consumed(); !slices.Equal(got, []string{"orders", "a.retry.x", "orders.retry.1", "orders.retry.2", "a.retry.x.retry.1", "a.retry.x.retry.2"}) {
		t.Fatalf("consumed %v", got)
	}
	for name, want := range map[string]int{
		"orders.retry.1": 1, "orders.retry.2": 2, "orders.retry.3": 0, "orders.retry.0": 0,
		"orders": 0, "other.retry.1": 0, "a.retry.x.retry.2": 2, "orders.retry.01": 1,
	} {
		if got := tp.LevelOf(name); got != want {
			t.Errorf("LevelOf(%q) = %d, want %d", name, got, want)
		}
	}
	if NewTopics([]string{"orders"}, 0, 0).LevelOf("orders.retry.1") != 0 {
		t.Error("without retry topics a retry topic's name has a level")
	}
}

func TestSinkBackoffDoublesWithinItsUpperHalfUpToTheCap(t *testing.T) {
	tp := NewTopics(nil, 0, 3*time.Second)
	for attempt, d := range map[int]time.Duration{0: 100 * time.Millisecond, 1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 6: 3 * time.Second, 40: 3 * time.Second} {
		for range 50 {
			if got := tp.SinkBackoff(attempt); got < d/2 || got > d {
				t.Fatalf("attempt %d: %v, want within [%v, %v]", attempt, got, d/2, d)
			}
		}
	}
	if got := NewTopics(nil, 0, 0).SinkBackoff(100); got > time.Second || got < time.Second/2 {
		t.Fatalf("a cap under 1s: %v, want within [0.5s, 1s]", got)
	}
}

// FuzzRoom runs waits, timers firing, forgets and exiles against a model:
// Due is true exactly for a record that waits, once; Waiting counts the
// waiting records; TakeExiled returns the exiled records in order, once.
func FuzzRoom(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 16, 17, 33, 50, 4})
	f.Add([]byte{1, 1, 1, 2, 18, 4, 4})
	f.Fuzz(func(t *testing.T, ops []byte) {
		r := New[byte, byte]()
		waiting := map[byte]byte{}
		var exiled []byte
		for i, op := range ops {
			k := op >> 3
			switch op & 7 {
			case 0, 1:
				r.Wait(k, byte(i))
				waiting[k] = byte(i)
			case 2:
				_, want := waiting[k]
				if got := r.Due(k); got != want {
					t.Fatalf("Due(%d) = %v, want %v", k, got, want)
				}
				delete(waiting, k)
			case 3:
				r.Forget(func(x byte) bool { return x%2 == k%2 }, func(x, w byte) {
					if ww, ok := waiting[x]; !ok || ww != w {
						t.Fatalf("forgot %d with timer %d, model %d (%v)", x, w, ww, ok)
					}
					delete(waiting, x)
				})
				for x := range waiting {
					if x%2 == k%2 {
						t.Fatalf("%d matched and was not forgotten", x)
					}
				}
			case 4:
				r.Exile(k)
				exiled = append(exiled, k)
			case 5:
				if got := r.TakeExiled(); !slices.Equal(got, exiled) {
					t.Fatalf("took %v, want %v", got, exiled)
				}
				exiled = nil
			case 6, 7:
				_, inWait := waiting[k]
				if _, ok := r.Find(func(t byte) bool { return t == k }); ok != (inWait || slices.Contains(exiled, k)) {
					t.Fatalf("Find(%d) = %v", k, ok)
				}
			}
			if r.Waiting() != len(waiting) {
				t.Fatalf("waiting %d, model %d", r.Waiting(), len(waiting))
			}
		}
	})
}

// FuzzLevelOf: a name made by Name from a consumed topic reads back its
// level when within the levels and 0 beyond; no name has a level outside
// [0, levels], and a name with a level ends in ".retry.<n>" of a consumed
// topic.
func FuzzLevelOf(f *testing.F) {
	f.Add("orders", 2, 1, "orders.retry.1")
	f.Add("a.retry.1", 3, 4, "x.retry.-1")
	f.Fuzz(func(t *testing.T, topic string, levels, n int, other string) {
		levels = levels % 8
		tp := NewTopics([]string{topic}, levels, time.Second)
		got := tp.LevelOf(Name(topic, n))
		want := 0
		if n >= 1 && n <= levels {
			want = n
		}
		if got != want {
			t.Fatalf("LevelOf(Name(%q, %d)) = %d with %d levels, want %d", topic, n, got, levels, want)
		}
		l := tp.LevelOf(other)
		if l < 0 || l > max(levels, 0) {
			t.Fatalf("LevelOf(%q) = %d, outside [0, %d]", other, l, levels)
		}
		if l > 0 && !strings.HasPrefix(other, topic+".retry.") {
			t.Fatalf("LevelOf(%q) = %d, not a retry topic of %q", other, l, topic)
		}
	})
}
