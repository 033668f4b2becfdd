package cost

import (
	"testing"
	"time"
)

func TestBandsSplitAtTheThresholds(t *testing.T) {
	for _, tc := range []struct {
		perRecord   time.Duration
		cheap, tiny bool
	}{
		{time.Nanosecond, true, true},
		{TinyBelow - 1, true, true},
		{TinyBelow, true, false},
		{CheapBelow - 1, true, false},
		{CheapBelow, false, false},
		{time.Second, false, false},
	} {
		m := New(0, true, true)
		m.Measured(tc.perRecord)
		if m.Cheap() != tc.cheap || m.Tiny() != tc.tiny || m.RunsOK() != tc.tiny {
			t.Errorf("%v: cheap %v tiny %v runs %v; want cheap %v tiny %v", tc.perRecord, m.Cheap(), m.Tiny(), m.RunsOK(), tc.cheap, tc.tiny)
		}
		if WorkerFast(tc.perRecord) != tc.cheap {
			t.Errorf("%v: WorkerFast %v, want %v", tc.perRecord, !tc.cheap, tc.cheap)
		}
	}
}

func TestUnmeasuredIsSlowButMayOpenAWideLane(t *testing.T) {
	m := New(0, true, true)
	if m.Cheap() || m.Tiny() || m.RunsOK() || !m.TinyOrUnmeasured() {
		t.Fatalf("unmeasured: cheap %v tiny %v runs %v wide %v", m.Cheap(), m.Tiny(), m.RunsOK(), m.TinyOrUnmeasured())
	}
	m.Measured(0) // a zero measure still counts as measured
	if m.PerRecord() == 0 || !m.Tiny() {
		t.Fatalf("measured 0: perRecord %v, tiny %v", m.PerRecord(), m.Tiny())
	}
}

func TestConfigurationRulesPathsOut(t *testing.T) {
	m := New(0, false, false)
	m.Measured(time.Nanosecond)
	if m.WideOK() || m.TinyOrUnmeasured() || m.RunsOK() || !m.Cheap() {
		t.Fatalf("neither wide lanes nor runs: wide %v runs %v cheap %v", m.TinyOrUnmeasured(), m.RunsOK(), m.Cheap())
	}
}

func TestPinnedMeasureWinsFromTheStart(t *testing.T) {
	m := New(time.Microsecond, true, true)
	if !m.Tiny() {
		t.Fatal("pinned tiny: not tiny before any measure")
	}
	m.Measured(time.Second)
	if !m.Tiny() || m.PerRecord() != time.Microsecond {
		t.Fatalf("pinned tiny measured slow: perRecord %v", m.PerRecord())
	}
}

// FuzzModel: whatever the measures, Tiny implies Cheap, the bands follow
// the last measure (or the pinned one), and a measured model stays
// measured.
func FuzzModel(f *testing.F) {
	f.Add(int64(0), []byte{1, 200, 3})
	f.Add(int64(1000), []byte{255, 0})
	f.Fuzz(func(t *testing.T, pinned int64, measures []byte) {
		m := New(time.Duration(pinned%int64(time.Millisecond)), true, true)
		for i, b := range measures {
			d := time.Duration(b) * 200 * time.Nanosecond // 0 to 51µs
			if i%2 == 1 {
				d = -d
			}
			m.Measured(d)
			want := d
			if m.pinned > 0 {
				want = m.pinned
			}
			want = max(want, 1)
			if m.PerRecord() != want {
				t.Fatalf("measured %v (pinned %v): perRecord %v, want %v", d, m.pinned, m.PerRecord(), want)
			}
			if m.Tiny() && !m.Cheap() {
				t.Fatalf("%v: tiny but not cheap", m.PerRecord())
			}
			if m.Cheap() != (want < CheapBelow) || m.Tiny() != (want < TinyBelow) {
				t.Fatalf("%v: cheap %v tiny %v", want, m.Cheap(), m.Tiny())
			}
		}
	})
}
