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
			meta, n := Encode('k', tc.base, tc.runs, MaxBytes)
			if n != len(tc.runs) {
				t.Fatalf("covered %d of %d runs", n, len(tc.runs))
			}
			if !strings.HasPrefix(meta, Prefix) {
				t.Fatalf("meta %q lacks prefix", meta)
			}
			_, got, err := Decode(meta, tc.base)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.runs) {
				t.Fatalf("decoded %v, want %v", got, tc.runs)
			}
			if enc := body(t, meta)[1+uvarintLen(uint64(tc.base))]; enc != tc.enc {
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
		meta, n := Encode('k', 0, runs, limit)
		if len(meta) > limit {
			t.Fatalf("limit %d: meta of %d bytes", limit, len(meta))
		}
		if n == 0 {
			if m, ok := Mode(meta); meta != "" && (!ok || m != 'k') {
				t.Fatalf("limit %d: no runs covered, and meta %q is neither plain nor the mode alone", limit, meta)
			}
			continue
		}
		_, got, err := Decode(meta, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, runs[:n]) {
			t.Fatalf("limit %d: decoded a set that is not the covered prefix", limit)
		}
		t.Logf("limit %d: %d alternating offsets covered (up to offset %d)", limit, n, runs[n-1].From)
	}
	// At the real cap the bitset form covers 8 offsets a byte.
	if _, n := Encode('k', 0, runs, MaxBytes); runs[n-1].To < 20_000 {
		t.Fatalf("at 4 KiB only up to offset %d is covered", runs[n-1].To)
	}
}

// TestEncodeNamesTheModeAlone: a commit with nothing finished above its
// base still names the committer's ordering mode; only a limit too small
// for that makes a plain commit.
func TestEncodeNamesTheModeAlone(t *testing.T) {
	meta, n := Encode('u', 7, nil, MaxBytes)
	if n != 0 || !strings.HasPrefix(meta, Prefix) {
		t.Fatalf("Encode(nil) = %q, %d; want the mode alone", meta, n)
	}
	mode, runs, err := Decode(meta, 7)
	if err != nil || mode != 'u' || runs != nil {
		t.Fatalf("Decode = %q, %v, %v; want mode u and no runs", mode, runs, err)
	}
	if m, ok := Mode(meta); !ok || m != 'u' {
		t.Fatalf("Mode = %q, %v", m, ok)
	}
	if meta, n := Encode('u', 7, []Run{{8, 9}}, 3); meta != "" || n != 0 {
		t.Fatalf("Encode with a tiny limit = %q, %d", meta, n)
	}
}

// TestDecodeReadsVersion1: metadata of kpar before version 2 still gives
// its finished runs, with no mode.
func TestDecodeReadsVersion1(t *testing.T) {
	v2, _ := Encode('k', 10, []Run{{12, 14}}, MaxBytes)
	body, err := decodeBase64(strings.TrimPrefix(v2, Prefix))
	if err != nil {
		t.Fatal(err)
	}
	v1 := "kpar1:" + base64.RawURLEncoding.EncodeToString(body[1:]) // without the mode byte
	mode, runs, err := Decode(v1, 10)
	if err != nil || mode != 0 || !slices.Equal(runs, []Run{{12, 14}}) {
		t.Fatalf("Decode(v1) = %q, %v, %v", mode, runs, err)
	}
	if _, ok := Mode(v1); ok {
		t.Fatal("Mode found a mode in version 1 metadata")
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := Encode('k', 10, []Run{{12, 14}, {20, 21}}, MaxBytes)
	goodRuns, _ := Encode('k', 10, []Run{{1000, 1001}}, MaxBytes)
	for _, tc := range []struct{ name, meta string }{
		{"empty", ""},
		{"kgo member id", "kgo-member-4f2c"},
		{"future version", "kpar3:" + strings.TrimPrefix(good, Prefix)},
		{"mode 0", Prefix + base64.RawURLEncoding.EncodeToString([]byte{0, 10, 'n'})},
		{"truncated", good[:len(good)-2]},
		{"prefix only", Prefix},
		{"bad base64", Prefix + "!!!!"},
		{"padded base64", good + "=="},
		{"trailing garbage", goodRuns + "AA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, runs, err := Decode(tc.meta, 10); err == nil {
				t.Fatalf("Decode(%q) = %v, want an error", tc.meta, runs)
			}
		})
	}
	t.Run("another base", func(t *testing.T) {
		if _, runs, err := Decode(good, 11); err == nil {
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
		meta, n := Encode('p', base, runs, limit)
		if len(meta) > limit {
			t.Fatalf("meta of %d bytes over the limit %d", len(meta), limit)
		}
		if n == 0 {
			return
		}
		mode, got, err := Decode(meta, base)
		if err != nil || mode != 'p' {
			t.Fatalf("Decode(Encode) = mode %q, %v", mode, err)
		}
		if !slices.Equal(got, runs[:n]) {
			t.Fatalf("decoded %v, want %v", got, runs[:n])
		}
	})
}

// FuzzDecode feeds garbage: Decode never panics, and whatever it accepts
// is a sorted set of non-touching runs strictly above the base.
func FuzzDecode(f *testing.F) {
	good, _ := Encode('k', 10, []Run{{12, 14}, {20, 21}}, MaxBytes)
	f.Add(good, int64(10))
	f.Add(Prefix+"AAAA", int64(0))
	f.Add("kgo-member", int64(3))
	f.Fuzz(func(t *testing.T, meta string, base int64) {
		_, runs, err := Decode(meta, base)
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
