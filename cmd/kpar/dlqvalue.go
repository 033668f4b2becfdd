package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// dlqValueMax bounds what `kpar dlq list` prints of one value: a letter
// is a line to read, and a 5 MiB record would bury the others; --json
// has the whole value.
const dlqValueMax = 4 << 10

// writeDLQValue prints r's value under its letter's line in `kpar dlq
// list`, indented so that the letters stay the unindented lines: pretty
// JSON when the value is JSON, the text when it is UTF-8, else base64 and
// the size (the encoding --json uses). An operator reads what failed
// without piping --json through jq and base64 -d.
func writeDLQValue(w io.Writer, r *kgo.Record) {
	const indent = "    "
	var v []byte
	if r != nil {
		v = r.Value
	}
	var head, body string
	switch {
	case v == nil && r != nil && slices.ContainsFunc(r.Headers, func(h kgo.RecordHeader) bool { return h.Key == deadletter.HeaderValueTruncated }):
		head = "value: cut by the sink (too large for the dead-letter topic)"
	case v == nil:
		head = "value: null"
	case len(v) == 0:
		head = "value: empty"
	case jsonObjectOrArray(v):
		var b bytes.Buffer
		json.Indent(&b, v, indent+"  ", "  ") // v is valid: no error
		head, body = "value (json):", b.String()
	case dlqText(v):
		head, body = "value (text):", strings.ReplaceAll(strings.TrimRight(string(v), "\r\n"), "\n", "\n"+indent+"  ")
	default:
		head = fmt.Sprintf("value (%d bytes, not UTF-8 text; base64): %s", len(v), dlqCutString(base64.StdEncoding.EncodeToString(v), dlqValueMax))
	}
	if body == "" {
		fmt.Fprintf(w, "%s%s\n", indent, head)
		return
	}
	fmt.Fprintf(w, "%s%s\n%s  %s\n", indent, head, indent, dlqCutString(body, dlqValueMax))
}

// jsonObjectOrArray reports whether v is a JSON object or array, spaces
// around it allowed: a bare JSON number or string reads better as text.
func jsonObjectOrArray(v []byte) bool {
	t := bytes.TrimSpace(v)
	return len(t) > 0 && (t[0] == '{' || t[0] == '[') && json.Valid(t)
}

// dlqText reports whether v is UTF-8 text a terminal shows as it is:
// printable characters, spaces, tabs and line breaks, no other controls
// (an escape sequence would rewrite the operator's screen).
func dlqText(v []byte) bool {
	if !utf8.Valid(v) {
		return false
	}
	for _, c := range string(v) {
		if !unicode.IsPrint(c) && !unicode.IsSpace(c) {
			return false
		}
		if c < 0x20 && c != '\n' && c != '\t' && c != '\r' {
			return false
		}
	}
	return true
}

// dlqCutString cuts s to about max bytes on a rune boundary, saying how
// much it left out and where the rest is.
func dlqCutString(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s ... (%d more bytes; --json prints the whole value)", s[:cut], len(s)-cut)
}
