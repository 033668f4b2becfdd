package forward

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"
)

// answer is one record's part of a 2xx batch answer.
type answer struct {
	status     int
	reason     string        // the endpoint's "error", as printable text
	retryAfter time.Duration // "retry_after", capped; 0 for none
	reply      []byte        // "reply", its JSON text; nil for none (Replies)
}

// answerItem is an object of a batch answer.
type answerItem struct {
	Status     *int            `json:"status"`
	Error      json.RawMessage `json:"error"`
	RetryAfter *float64        `json:"retry_after"`
	Reply      json.RawMessage `json:"reply"`
}

// answerShape is what a 2xx batch answer may be, for the error of one
// that is not.
const answerShape = `want an empty body, or a JSON array with one item per record in request order, ` +
	`each a status code (200 to 599) or an object {"status": 422, "error": "why", "retry_after": seconds, "reply": any JSON}`

// readAnswers reads a 2xx batch answer of n records: nil for an empty body
// (all done), else one answer per record. It closes the body. Its error
// names the shape it wanted and quotes what it got.
func readAnswers(resp *http.Response, n int, maxRetryAfter time.Duration) ([]answer, error) {
	defer drain(resp)
	if resp.ContentLength == 0 {
		return nil, nil
	}
	// Room for a reason of a few hundred bytes per record.
	limit := int64(drainLimit + 1024*n)
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %v", err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("the answer is longer than %d bytes for %d records: %s", limit, n, answerShape)
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, nil
	}
	bad := func(why string) error {
		return fmt.Errorf("%s: %s; got: %s", why, answerShape, excerpt(body))
	}
	var items []json.RawMessage
	if err := json.Unmarshal(body, &items); err != nil {
		return nil, bad("the answer is not a JSON array")
	}
	if len(items) != n {
		return nil, bad(fmt.Sprintf("the answer has %d items for %d records", len(items), n))
	}
	answers := make([]answer, n)
	for i, raw := range items {
		a, err := readAnswer(raw, maxRetryAfter)
		if err != nil {
			return nil, bad(fmt.Sprintf("item %d (from 0) %s", i, err))
		}
		answers[i] = a
	}
	return answers, nil
}

// readAnswer reads one item of a batch answer: a status code, or an object.
func readAnswer(raw json.RawMessage, maxRetryAfter time.Duration) (answer, error) {
	var a answer
	if len(raw) > 0 && raw[0] != '{' {
		if err := json.Unmarshal(raw, &a.status); err != nil {
			return a, fmt.Errorf("is %s, neither a status code nor an object", excerpt(raw))
		}
		return a, checkItemStatus(a.status)
	}
	var it answerItem
	if err := json.Unmarshal(raw, &it); err != nil {
		return a, fmt.Errorf("is an object whose fields do not fit (%v)", err)
	}
	if it.Status == nil {
		return a, fmt.Errorf(`has no "status"`)
	}
	a.status = *it.Status
	if err := checkItemStatus(a.status); err != nil {
		return a, err
	}
	if len(it.Error) > 0 && string(it.Error) != "null" {
		var s string
		if json.Unmarshal(it.Error, &s) != nil {
			s = string(it.Error) // an object or a number: its JSON text
		}
		a.reason = printable([]byte(s[:min(len(s), snippetLimit)]))
	}
	if len(it.Reply) > 0 && string(it.Reply) != "null" {
		a.reply = it.Reply
	}
	if it.RetryAfter != nil && *it.RetryAfter > 0 {
		d := maxRetryAfter
		if secs := *it.RetryAfter; secs < maxRetryAfter.Seconds() && !math.IsInf(secs, 0) {
			d = time.Duration(secs * float64(time.Second))
		}
		a.retryAfter = min(d, maxRetryAfter)
	}
	return a, nil
}

// checkItemStatus refuses an item status that is no final HTTP status,
// such as 999 or -5: read as a record's own answer it would be retried
// like a 5xx (classify retries what it does not know), hiding an endpoint
// bug behind retries and, in the end, dead letters for records that
// nothing was wrong with. It makes the whole answer malformed instead,
// like any other answer of the wrong shape.
func checkItemStatus(status int) error {
	if status < 200 || status > 599 {
		return fmt.Errorf("has status %d, not a final HTTP status (200 to 599)", status)
	}
	return nil
}

// excerpt is the start of b for an error message.
func excerpt(b []byte) string {
	const limit = 120
	if len(b) <= limit {
		return printable(b)
	}
	return strings.TrimSpace(printable(b[:limit])) + "..."
}

// BatchAnswer is one item of a batch answer, for an endpoint written in
// Go: answer a batch with a JSON array of them, one per record in request
// order.
type BatchAnswer struct {
	Status int `json:"status"` // the record's status, as its own request's
	// Error says why the record failed; kpar puts it in the dead letter's
	// message (StatusError.Reason).
	Error string `json:"error,omitempty"`
	// RetryAfter asks kpar to wait this many seconds before retrying the
	// record, capped at MaxRetryAfter.
	RetryAfter float64 `json:"retry_after,omitempty"`
	// Reply, with Replies, becomes the value of the record's reply: its
	// JSON text. Nil makes none.
	Reply any `json:"reply,omitempty"`
}
