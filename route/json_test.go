package route

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/cel-go/common/types"
)

// oracleJSON is parseJSON done with encoding/json: what parseJSON must
// give.
func oracleJSON(b []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return oracleNumbers(v), true
}

func oracleNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		s := string(x)
		if !strings.ContainsAny(s, ".eE") {
			if i, err := strconv.ParseInt(s, 10, 64); err == nil {
				return i
			}
			if u, err := strconv.ParseUint(s, 10, 64); err == nil {
				return u
			}
		}
		f, _ := strconv.ParseFloat(s, 64)
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = oracleNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = oracleNumbers(e)
		}
	}
	return v
}

var jsonSeeds = []string{
	`{"id":"9f1c","type":"order","customer":{"id":48213,"tier":"gold"},"amount":129.95,"items":[{"sku":"A-1","qty":2}],"ok":true,"none":null}`,
	`9007199254740993`, `-9223372036854775808`, `18446744073709551615`, `18446744073709551616`, `-0`, `0.5e-3`, `1E400`, `-1e-400`,
	`123456789012345678`, `-123456789012345678`, `1234567890123456789`,
	`"a\"b\\c\/d\b\f\n\r\t\u00e9\u20ac\ud83d\ude00"`, `"\ud83d"`, `"\ude00x"`, `"\ud83d\u0041"`, "\"\xff\xfe\"", "\"caf\xc3\xa9\"",
	`[]`, `{}`, ` [1, [2, [3]], {"a": []}] `, `{"a":1,"a":2}`,
	``, ` `, `{`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `01`, `1.`, `.5`, `1e`, `-`, `+1`, `tru`, `nul`, `"abc`, "\"a\nb\"", `"\x"`, `"\u12"`,
	`1 2`, `{} x`, `{}}`, `[1] `, "\t\r\n true \n",
}

func TestParseJSONAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range jsonSeeds {
		checkParseJSON(t, []byte(s))
	}
	// Deeper than encoding/json's limit: an error, not a stack overflow.
	deep := strings.Repeat(`{"a":[`, 20000) + strings.Repeat("]}", 20000)
	if v, ok := parseJSON([]byte(deep), "value").(*types.Err); !ok || !strings.Contains(v.String(), "nested too deeply") {
		t.Errorf("20,000 levels deep: %v, want an error", v)
	}
}

func FuzzParseJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkParseJSON(t, b) })
}

func checkParseJSON(t *testing.T, b []byte) {
	t.Helper()
	want, ok := oracleJSON(b)
	got := parseJSON(b, "value")
	_, failed := got.(*types.Err)
	switch {
	case ok && failed:
		t.Fatalf("parseJSON(%q) failed (%v); encoding/json took it", b, got)
	case !ok && !failed:
		t.Fatalf("parseJSON(%q) = %#v; encoding/json refused it", b, got)
	case ok && !reflect.DeepEqual(got, want):
		t.Fatalf("parseJSON(%q) = %#v, want %#v", b, got, want)
	}
}
