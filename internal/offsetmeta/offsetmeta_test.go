package offsetmeta

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		base int64
		runs []Run
		enc  byte
	}{
		{"one offset right above base", 10, []Run{{11, 12}}, encBitset},
		{"dense", 0, []Run{{1, 3}, {4, 9}, {10, 11}}, encBitset},
		{"sparse far runs", 100, []Run{{1000, 1001}, {50000, 50010}}, encRuns},
		{"long run", 5, []Run{{6, 1 << 20}}, encRuns},
		{"large base", 1 << 40, []Run{{1<<40 + 2, 1<<40 + 4}}, encBitset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta, n := Encode(tc.base, tc.runs, MaxBytes)
			if n != len(tc.runs) {
				t.Fatalf("covered %d of %d runs", n, len(tc.runs))
			}
			if !strings.HasPrefix(meta, Prefix) {
				t.Fatalf("meta %q lacks prefix", meta)
			}
			got, err := Decode(meta, tc.base)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.runs) {
				t.Fatalf("decoded %v, want %v", got, tc.runs)
			}
			if enc := body(t, meta)[uvarintLen(uint64(tc.base))]; enc != tc.enc {
				t.Errorf("encoding %q, want the smaller %q", enc, tc.enc)
			}
		})
	}
}

func body(t *testing.T, meta string) []byte {
	t.Helper()
	b, err := decodeBase64(strings.TrimPrefix(meta, Prefix))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEncodeCutsToTheCap checks the worst case for the cap: every other
// offset finished, so neither encoding compresses well. What fits is a
// prefix, and the string never passes the limit.
func TestEncodeCutsToTheCap(t *testing.T) {
	var runs []Run
	for o := int64(2); o < 200_000; o += 2 {
		runs = append(runs, Run{o, o + 1})
	}
	for _, limit := range []int{MaxBytes, 1000, 100, len(Prefix) + 4} {
		meta, n := Encode(0, runs, limit)
		if len(meta) > limit {
			t.Fatalf("limit %d: meta of %d bytes", limit, len(meta))
		}
		if n == 0 {
			if meta != "" {
				t.Fatalf("limit %d: no runs covered but meta %q", limit, meta)
			}
			continue
		}
		got, err := Decode(meta, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, runs[:n]) {
			t.Fatalf("limit %d: decoded a set that is not the covered prefix", limit)
		}
		t.Logf("limit %d: %d alternating offsets covered (up to offset %d)", limit, n, runs[n-1].From)
	}
	// At the real cap the bitset form covers 8 offsets a byte.
	if _, n := Encode(0, runs, MaxBytes); runs[n-1].To < 20_000 {
		t.Fatalf("at 4 KiB only up to offset %d is covered", runs[n-1].To)
	}
}

func TestEncodeNothing(t *testing.T) {
	if meta, n := Encode(7, nil, MaxBytes); meta != "" || n != 0 {
		t.Fatalf("Encode(nil) = %q, %d", meta, n)
	}
	if meta, n := Encode(7, []Run{{8, 9}}, 3); meta != "" || n != 0 {
		t.Fatalf("Encode with a tiny limit = %q, %d", meta, n)
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := Encode(10, []Run{{12, 14}, {20, 21}}, MaxBytes)
	goodRuns, _ := Encode(10, []Run{{1000, 1001}}, MaxBytes)
	for _, tc := range []struct{ name, meta string }{
		{"empty", ""},
		{"kgo member id", "kgo-member-4f2c"},
		{"future version", "kpar2:" + strings.TrimPrefix(good, Prefix)},
		{"truncated", good[:len(good)-2]},
		{"prefix only", Prefix},
		{"bad base64", Prefix + "!!!!"},
		{"padded base64", good + "=="},
		{"trailing garbage", goodRuns + "AA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if runs, err := Decode(tc.meta, 10); err == nil {
				t.Fatalf("Decode(%q) = %v, want an error", tc.meta, runs)
			}
		})
	}
	t.Run("another base", func(t *testing.T) {
		if runs, err := Decode(good, 11); err == nil {
			t.Fatalf("decoded %v for a different committed offset", runs)
		}
	})
}

// FuzzRoundTrip builds a finished set from arbitrary bytes and checks that
// what decodes is exactly the prefix Encode says it covered, within the cap.
func FuzzRoundTrip(f *testing.F) {
	f.Add(int64(0), []byte{1, 2, 3, 0, 9}, 4096)
	f.Add(int64(1<<40), []byte{200, 1, 255, 255}, 100)
	f.Fuzz(func(t *testing.T, base int64, steps []byte, limit int) {
		if base < 0 || base > 1<<60 {
			return
		}
		limit = min(max(limit, 0), MaxBytes)
		var runs []Run
		next := base + 1
		for i := 0; i+1 < len(steps); i += 2 {
			from := next + int64(steps[i])
			if len(runs) > 0 && from == next {
				from++ // runs never touch
			}
			to := from + 1 + int64(steps[i+1])
			runs = append(runs, Run{from, to})
			next = to
		}
		meta, n := Encode(base, runs, limit)
		if len(meta) > limit {
			t.Fatalf("meta of %d bytes over the limit %d", len(meta), limit)
		}
		if n == 0 {
			return
		}
		got, err := Decode(meta, base)
		if err != nil {
			t.Fatalf("Decode(Encode) failed: %v", err)
		}
		if !slices.Equal(got, runs[:n]) {
			t.Fatalf("decoded %v, want %v", got, runs[:n])
		}
	})
}

// FuzzDecode feeds garbage: Decode never panics, and whatever it accepts
// is a sorted set of non-touching runs strictly above the base.
func FuzzDecode(f *testing.F) {
	good, _ := Encode(10, []Run{{12, 14}, {20, 21}}, MaxBytes)
	f.Add(good, int64(10))
	f.Add(Prefix+"AAAA", int64(0))
	f.Add("kgo-member", int64(3))
	f.Fuzz(func(t *testing.T, meta string, base int64) {
		runs, err := Decode(meta, base)
		if err != nil {
			if runs != nil {
				t.Fatal("runs returned with an error")
			}
			return
		}
		prev := base
		for i, r := range runs {
			if r.From <= prev || r.To <= r.From || (i > 0 && r.From == prev) {
				t.Fatalf("bad run %d %v after %d (base %d)", i, r, prev, base)
			}
			prev = r.To
		}
	})
}

func decodeBase64(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
