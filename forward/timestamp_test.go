package forward

import (
	"testing"
	"time"
)

// appendTimestamp writes what AppendFormat writes with TimestampLayout,
// whatever the time's zone, the far past and future included.
func TestForwardTimestampIsTheLayoutsInUTC(t *testing.T) {
	zone := time.FixedZone("x", -(3*3600 + 30*60))
	for _, tm := range []time.Time{
		time.UnixMilli(0),
		time.UnixMilli(-1),
		time.UnixMilli(1_700_000_000_123),
		time.Date(2026, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(2027, 1, 1, 1, 2, 3, 4_000_000, zone),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 6, 1, 0, 0, 0, 0, time.UTC),
		time.UnixMilli(1<<62 - 1),
		time.UnixMilli(-1 << 62),
	} {
		want := tm.UTC().Format(TimestampLayout)
		if got := string(appendTimestamp([]byte("x"), tm)); got != "x"+want {
			t.Errorf("appendTimestamp(%v) = %q, want %q", tm, got[1:], want)
		}
	}
}

func FuzzForwardTimestamp(f *testing.F) {
	f.Add(int64(1_700_000_000_123))
	f.Add(int64(-62_135_596_800_000))
	f.Fuzz(func(t *testing.T, ms int64) {
		tm := time.UnixMilli(ms)
		if got, want := string(appendTimestamp(nil, tm)), tm.UTC().Format(TimestampLayout); got != want {
			t.Errorf("appendTimestamp(%d ms) = %q, want %q", ms, got, want)
		}
	})
}
