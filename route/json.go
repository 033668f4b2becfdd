package route

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/google/cel-go/common/types"
)

// maxJSONDepth bounds the nesting of a parsed value, as encoding/json's
// does, so that a hostile record cannot exhaust the stack.
const maxJSONDepth = 10000

// parseJSON parses b, one JSON value, into the Go values CEL adapts:
// map[string]any, []any, string, bool, nil, and numbers as int64 (uint64
// above int64, float64 beyond or with a fraction or exponent), so that
// long IDs compare exactly. A value that is not JSON is a CEL error.
//
// It accepts and rejects what encoding/json does and gives the same values
// (FuzzParseJSON), at a fraction of the cost: it is on the path of every
// record a filter reads the value of.
func parseJSON(b []byte, what string) any {
	p := jsonParser{b: b}
	p.space()
	v, err := p.value(0)
	if err == nil {
		if p.space(); p.i < len(b) {
			err = p.errorf("after the value")
		}
	}
	if err != nil {
		return types.NewErr("%s is not JSON: %v", what, err)
	}
	return v
}

type jsonParser struct {
	b []byte
	i int
}

var errJSONDepth = errors.New("nested too deeply")

func (p *jsonParser) errorf(where string) error {
	if p.i >= len(p.b) {
		return errors.New("unexpected end of JSON input")
	}
	return fmt.Errorf("invalid character %q at offset %d %s", p.b[p.i], p.i, where)
}

func (p *jsonParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (any, error) {
	if p.i >= len(p.b) {
		return nil, p.errorf("")
	}
	switch c := p.b[p.i]; {
	case c == '{':
		if depth >= maxJSONDepth {
			return nil, errJSONDepth
		}
		return p.object(depth + 1)
	case c == '[':
		if depth >= maxJSONDepth {
			return nil, errJSONDepth
		}
		return p.array(depth + 1)
	case c == '"':
		return p.str()
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	}
	return nil, p.errorf("looking for the beginning of a value")
}

func (p *jsonParser) literal(s string) error {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		for k := 0; k < len(s) && p.i < len(p.b) && p.b[p.i] == s[k]; k++ {
			p.i++
		}
		return p.errorf("in literal " + s)
	}
	p.i += len(s)
	return nil
}

func (p *jsonParser) object(depth int) (any, error) {
	p.i++ // {
	m := map[string]any{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return m, nil
	}
	for {
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, p.errorf("looking for the beginning of an object key")
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, p.errorf("after an object key")
		}
		p.i++
		p.space()
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		m[k] = v
		p.space()
		if p.i < len(p.b) {
			switch p.b[p.i] {
			case ',':
				p.i++
				p.space()
				continue
			case '}':
				p.i++
				return m, nil
			}
		}
		return nil, p.errorf("after an object value")
	}
}

func (p *jsonParser) array(depth int) (any, error) {
	p.i++ // [
	a := []any{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return a, nil
	}
	for {
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		p.space()
		if p.i < len(p.b) {
			switch p.b[p.i] {
			case ',':
				p.i++
				p.space()
				continue
			case ']':
				p.i++
				return a, nil
			}
		}
		return nil, p.errorf("after an array element")
	}
}

// str parses a string at p.i (its opening quote). Invalid UTF-8 and
// unpaired surrogates become U+FFFD, as in encoding/json.
func (p *jsonParser) str() (string, error) {
	p.i++ // "
	start := p.i
	// The common string: no escape, ASCII or valid UTF-8.
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			return string(s), nil
		case c == '\\' || c < ' ':
			return p.slowStr(start)
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(p.b[p.i:])
			if r == utf8.RuneError && size == 1 {
				return p.slowStr(start)
			}
			p.i += size
		default:
			p.i++
		}
	}
	return "", p.errorf("in a string")
}

func (p *jsonParser) slowStr(start int) (string, error) {
	out := append([]byte(nil), p.b[start:p.i]...)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return string(out), nil
		case c < ' ':
			return "", p.errorf("in a string")
		case c == '\\':
			if p.i+1 >= len(p.b) {
				p.i++
				return "", p.errorf("in a string escape")
			}
			p.i++
			switch e := p.b[p.i]; e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := p.hex4(p.i + 1)
				if !ok {
					return "", p.errorf("in a \\u escape")
				}
				p.i += 4
				if utf16.IsSurrogate(r) {
					// A high surrogate and the low one after it are one
					// rune; any other is U+FFFD.
					hi := r
					r = utf8.RuneError
					if p.i+2 < len(p.b) && p.b[p.i+1] == '\\' && p.b[p.i+2] == 'u' {
						if lo, ok := p.hex4(p.i + 3); ok {
							if d := utf16.DecodeRune(hi, lo); d != utf8.RuneError {
								r = d
								p.i += 6
							}
						}
					}
				}
				out = utf8.AppendRune(out, r)
			default:
				return "", p.errorf("in a string escape")
			}
			p.i++
		case c < utf8.RuneSelf:
			out = append(out, c)
			p.i++
		default:
			r, size := utf8.DecodeRune(p.b[p.i:])
			out = utf8.AppendRune(out, r) // RuneError for an invalid byte
			p.i += size
		}
	}
	return "", p.errorf("in a string")
}

// hex4 reads the 4 hex digits at i.
func (p *jsonParser) hex4(i int) (rune, bool) {
	if i+4 > len(p.b) {
		return 0, false
	}
	var r rune
	for _, c := range p.b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number parses a number at p.i: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *jsonParser) number() (any, error) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case digits() == 0:
		return nil, p.errorf("in numeric literal")
	}
	integer := true
	if p.i < len(p.b) && p.b[p.i] == '.' {
		integer = false
		p.i++
		if digits() == 0 {
			return nil, p.errorf("after decimal point in numeric literal")
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		integer = false
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return nil, p.errorf("in exponent of numeric literal")
		}
	}
	if integer && p.i-start <= 18 {
		// Fits an int64 whatever its digits: no string, no strconv.
		var n int64
		neg := p.b[start] == '-'
		for _, c := range p.b[start:p.i] {
			if c != '-' {
				n = n*10 + int64(c-'0')
			}
		}
		if neg {
			n = -n
		}
		return n, nil
	}
	s := string(p.b[start:p.i])
	if integer {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i, nil
		}
		if u, err := strconv.ParseUint(s, 10, 64); err == nil {
			return u, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !math.IsInf(f, 0) {
		return nil, fmt.Errorf("number %s: %v", s, err)
	}
	return f, nil
}
