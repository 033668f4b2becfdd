package jsonstr

import (
	"encoding/json"
	"testing"
)

// check fails unless Append(s) is a JSON string that reads back as s, each
// byte that is not valid UTF-8 as U+FFFD, in both of its input types.
func check(t *testing.T, s []byte) {
	t.Helper()
	out := Append(nil, s)
	if str := Append(nil, string(s)); string(str) != string(out) {
		t.Fatalf("Append(%q) differs for a string (%s) and a []byte (%s)", s, str, out)
	}
	var back string
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatalf("Append(%q) = %s, not a JSON string: %v", s, out, err)
	}
	if want := string([]rune(string(s))); back != want {
		t.Fatalf("Append(%q) = %s reads back as %q, want %q", s, out, back, want)
	}
}

func TestAppendReadsBackAsTheSameText(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uo\te`, "ctl\x00\x1f\x7f", "<&>", "café ☕ 😀", "bad\xff\xfeutf8", "cut\xe2\x82"} {
		check(t, []byte(s))
	}
	if got := string(Append(nil, "<a&b>\x7f")); got != `"<a&b>\u007f"` {
		t.Errorf(`Append("<a&b>\x7f") = %s, want "<a&b>\u007f" (no HTML escapes)`, got)
	}
}

func FuzzAppend(f *testing.F) {
	f.Add([]byte("café\xff\"\\\n"))
	f.Fuzz(check)
}
