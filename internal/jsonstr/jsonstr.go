// Package jsonstr writes JSON strings without reflection, for the request
// bodies and decoded values kpar builds byte by byte (forward's batches,
// the schema module's decoders).
package jsonstr

import "unicode/utf8"

// Append appends s as a JSON string: quotes, backslashes and control
// characters escaped, and bytes that are not valid UTF-8 as U+FFFD, as
// encoding/json does (but <, > and & are kept: the bodies are not HTML).
func Append[S ~string | ~[]byte](b []byte, s S) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < ' ' || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		// At most UTFMax bytes: a short conversion the compiler keeps on
		// the stack, whatever the length of s.
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
