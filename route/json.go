package route

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/google/cel-go/common/types"
)

// parseJSON parses b, one JSON value, into the Go values CEL adapts:
// map[string]any, []any, string, bool, nil, and numbers as int64 (uint64
// above int64, float64 beyond or with a fraction or exponent), so that
// long IDs compare exactly. A value that is not JSON is a CEL error.
//
// It is encoding/json with UseNumber and one pass over the numbers. A
// parser of our own measured 2-3x faster (2-4µs against 6-7µs for a
// 200-byte order), but a record a filter reads costs an HTTP request
// besides, and the standard library's parser is the one we need not
// maintain or fuzz.
func parseJSON(b []byte, what string) any {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return types.NewErr("%s is not JSON: %v", what, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return types.NewErr("%s is not JSON: more after the value", what)
	}
	return exactNumbers(v)
}

// exactNumbers replaces each json.Number in v by an int64, a uint64 or a
// float64, in place.
func exactNumbers(v any) any {
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
			x[k] = exactNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = exactNumbers(e)
		}
	}
	return v
}
