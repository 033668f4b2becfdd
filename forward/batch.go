package forward

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kpar/kpar/internal/jsonstr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// batcher collects the records of concurrent Handle calls into requests.
// The first record of a batch makes its caller the batch's leader: it
// waits until the batch is full or the wait is over, sends it, and hands
// every member its record's outcome. No goroutine of its own: a batch
// lives exactly as long as the Handle calls that make it.
type batcher struct {
	h    *Handler
	n    int
	wait time.Duration

	mu  sync.Mutex
	cur *batch // guarded by mu: the batch being filled, nil when none
}

// batch is one request's worth of records.
type batch struct {
	// Appended under batcher.mu until the leader takes the batch; read
	// only by the leader after that.
	recs []*kgo.Record
	ctxs []context.Context
	// decs are the records' decoded forms (Decode); nil when no record
	// has one.
	decs []*Decoded
	// replies are the replies of the records, written by the leader
	// before done closes (Replies); nil for none.
	replies [][]byte
	full    chan struct{} // closed when len(recs) reaches n
	errs    []error       // written by the leader before done closes
	done    chan struct{}
}

func (b *batcher) handle(ctx context.Context, r *kgo.Record) error {
	// A record that does not decode fails alone, before it joins a batch.
	dec, err := b.h.decode(ctx, r)
	if err != nil {
		return err
	}
	b.mu.Lock()
	bt := b.cur
	leader := bt == nil
	if leader {
		bt = &batch{
			recs: make([]*kgo.Record, 0, b.n),
			ctxs: make([]context.Context, 0, b.n),
			full: make(chan struct{}),
			done: make(chan struct{}),
		}
		b.cur = bt
	}
	i := len(bt.recs)
	bt.recs = append(bt.recs, r)
	bt.ctxs = append(bt.ctxs, ctx)
	if dec != nil && bt.decs == nil {
		bt.decs = make([]*Decoded, i, b.n)
	}
	if bt.decs != nil {
		bt.decs = append(bt.decs, dec)
	}
	if len(bt.recs) == b.n {
		b.cur = nil
		close(bt.full)
	}
	b.mu.Unlock()

	if !leader {
		// A member waits for the answer even when its context ends: its
		// record may be on the wire, and returning early would let kpar
		// start the next record of its key before the endpoint answered
		// this one. The request itself ends when every member's context
		// has (see send).
		<-bt.done
		return b.done(ctx, bt, i)
	}
	t := time.NewTimer(b.wait)
	select {
	case <-bt.full:
	case <-t.C:
	}
	t.Stop()
	b.mu.Lock()
	if b.cur == bt {
		b.cur = nil
	}
	b.mu.Unlock()
	b.send(bt)
	close(bt.done)
	return b.done(ctx, bt, 0)
}

// done returns the outcome of member i of bt, once the answer came, with
// its reply emitted in its own context, which kpar.Emit needs.
func (b *batcher) done(ctx context.Context, bt *batch, i int) error {
	if err := bt.errs[i]; err != nil || bt.replies == nil || bt.replies[i] == nil {
		return err
	}
	return b.h.emitValue(ctx, bt.recs[i], bt.replies[i], "application/json")
}

// send posts bt and fills bt.errs.
func (b *batcher) send(bt *batch) {
	h := b.h
	n := len(bt.recs)
	bt.errs = make([]error, n)
	fail := func(err error) {
		for i := range bt.errs {
			bt.errs[i] = err
		}
	}

	// The request lives while any member still waits for it: it ends
	// when the last member's context does (with that context's error as
	// the cause, so that a deadline reads as a timeout), or at Timeout.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(bt.ctxs[0]))
	defer cancel(nil)
	var left atomic.Int32
	left.Store(int32(n))
	for _, c := range bt.ctxs {
		stop := context.AfterFunc(c, func() {
			if left.Add(-1) == 0 {
				cancel(c.Err())
			}
		})
		defer stop()
	}
	ctx, cancelTimeout := h.withTimeout(ctx)
	defer cancelTimeout()

	body := appendBatch(make([]byte, 0, batchSize(bt.recs, bt.decs)), bt.recs, bt.decs, h.contentType[0])
	req := h.newRequest(ctx, body, 3)
	req.Header["Content-Type"] = jsonType
	if tp, ts := batchTrace(bt.recs); tp != "" {
		req.Header[httpTraceParent] = []string{tp}
		if ts != "" {
			req.Header[httpTraceState] = []string{ts}
		}
	}
	started := h.answered.Load()
	resp, err := h.do(req)
	if err != nil {
		fail(h.transportError(ctx, started, fmt.Errorf("forward: batch of %d: %w", n, err)))
		return
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		err := h.failure(resp)
		var serr *StatusError
		if errors.As(err, &serr) {
			serr.Batch = n
		}
		fail(err)
		return
	}
	h.answered.Add(1)
	answers, err := readAnswers(resp, n, h.maxRetryAfter)
	if err != nil {
		// The endpoint is broken, not the records: retryable for all.
		fail(&StatusError{StatusCode: resp.StatusCode, Status: resp.Status, URL: h.redactedURL, Batch: n, Body: err.Error()})
		return
	}
	for i, a := range answers {
		if a.status >= 200 && a.status <= 299 {
			if a.reply != nil && h.replyTopic != "" {
				if bt.replies == nil {
					bt.replies = make([][]byte, n)
				}
				bt.replies[i] = a.reply
			}
			continue
		}
		serr := &StatusError{
			StatusCode: a.status, Status: statusLine(a.status), URL: h.redactedURL, Batch: n,
			Reason: a.reason, RetryAfter: a.retryAfter,
		}
		bt.errs[i] = h.classify(serr, resp.Header.Get("Retry-After"))
	}
}

func statusLine(c int) string {
	if t := http.StatusText(c); t != "" {
		return strconv.Itoa(c) + " " + t
	}
	return strconv.Itoa(c)
}

// batchTrace returns the trace context of the first record that has one.
func batchTrace(rs []*kgo.Record) (traceparent, tracestate string) {
	for _, r := range rs {
		var tp, ts []byte
		for _, h := range r.Headers {
			switch h.Key {
			case TraceParent:
				tp = h.Value
			case TraceState:
				ts = h.Value
			}
		}
		if tp != nil && validFieldValue(string(tp)) {
			if !validFieldValue(string(ts)) {
				ts = nil
			}
			return string(tp), string(ts)
		}
	}
	return "", ""
}

// batchSize estimates the JSON size of rs, so the body is built without
// growing its buffer in the usual case (names without escapes).
func batchSize(rs []*kgo.Record, decs []*Decoded) int {
	n := 2
	for _, d := range decs {
		if d != nil {
			n += 64 + len(d.Value) + len(d.Key)
		}
	}
	for _, r := range rs {
		n += 128 + len(r.Topic) + base64.StdEncoding.EncodedLen(len(r.Key)) + base64.StdEncoding.EncodedLen(len(r.Value))
		for _, h := range r.Headers {
			n += 2*(len(h.Key)+base64.StdEncoding.EncodedLen(len(h.Value))) + 16
		}
	}
	return n
}

// appendBatch appends the JSON array of rs (see the package
// documentation); contentType is that of a record without one, and
// decs, when not nil, the records' decoded forms.
func appendBatch(b []byte, rs []*kgo.Record, decs []*Decoded, contentType string) []byte {
	b = append(b, '[')
	for i, r := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"topic":`...)
		b = jsonstr.Append(b, r.Topic)
		b = append(b, `,"partition":`...)
		b = strconv.AppendInt(b, int64(r.Partition), 10)
		b = append(b, `,"offset":`...)
		b = strconv.AppendInt(b, r.Offset, 10)
		b = append(b, `,"timestamp":"`...)
		b = appendTimestamp(b, r.Timestamp)
		b = append(b, `","key":`...)
		b = appendBase64OrNull(b, r.Key)
		b = append(b, `,"value":`...)
		ct := recordContentType(r, contentType)
		if decs != nil && decs[i] != nil {
			b = appendDecodedItem(b, r, decs[i])
			if f := decs[i].ValueForm; f != FormRaw && f != "" {
				ct = "application/json"
			}
		} else {
			b = appendBase64OrNull(b, r.Value)
		}
		b = append(b, `,"content_type":`...)
		b = jsonstr.Append(b, ct)
		b = append(b, `,"headers":{`...)
		first := true
		for j, h := range r.Headers {
			if laterHeader(r.Headers[j+1:], h.Key) {
				continue // the object keeps the last value of a name
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = jsonstr.Append(b, h.Key)
			b = append(b, ':', '"')
			b = base64.StdEncoding.AppendEncode(b, h.Value)
			b = append(b, '"')
		}
		b = append(b, `},"header_list":[`...)
		for j, h := range r.Headers {
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, '[')
			b = jsonstr.Append(b, h.Key)
			b = append(b, ',', '"')
			b = base64.StdEncoding.AppendEncode(b, h.Value)
			b = append(b, '"', ']')
		}
		b = append(b, ']', '}')
	}
	return append(b, ']')
}

func laterHeader(hs []kgo.RecordHeader, k string) bool {
	for _, h := range hs {
		if h.Key == k {
			return true
		}
	}
	return false
}

func appendBase64OrNull(b, v []byte) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, v)
	return append(b, '"')
}

// BatchRecord is one element of a batch request's JSON array, for a
// receiver written in Go: json.Unmarshal into []BatchRecord decodes the
// body, base64 included (encoding/json reads []byte as base64), with Key
// and Value nil for null.
type BatchRecord struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Timestamp time.Time `json:"timestamp"`
	Key       []byte    `json:"key"`
	Value     []byte    `json:"value"`
	// ContentType is the record's content-type header, or the Handler's
	// ContentType when it has none.
	ContentType string `json:"content_type"`
	// Headers has the last value of each header name.
	Headers map[string][]byte `json:"headers"`
	// HeaderList has every header in record order: [name, base64 value].
	HeaderList [][2]string `json:"header_list"`
}
