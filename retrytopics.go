package kpar

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/internal/retry"
)

// Headers of records in retry topics. A retry record keeps the original's
// key, value and headers, followed by the dead-letter headers that say
// where it came from and how it failed (deadletter.HeaderTopic,
// HeaderPartition, HeaderOffset, HeaderOriginalTimestamp,
// HeaderDeliveryCount, HeaderClass, HeaderMessage, HeaderFirstFailure,
// HeaderLastFailure; same names, same UTF-8 encodings, so `kpar dlq` and
// kcat read retry topics as they read dead letters), and two of its own.
const (
	HeaderRetryLevel = "kpar.retry.level" // n of <topic>.retry.<n>, decimal
	HeaderRetryDue   = "kpar.retry.due"   // RFC 3339, milliseconds, UTC
)

// RetryTopic names the n-th retry topic (from 1) of topic.
func RetryTopic(topic string, n int) string { return retry.Name(topic, n) }

// createRetryTopics creates missing retry topics with their source's
// partition count. It is best effort: without the permission to create
// topics, an operator creates them and kpar only logs.
func (e *engine) createRetryTopics(ctx context.Context, cl *kgo.Client) {
	if len(e.cfg.retryTopics) == 0 {
		return
	}
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	details, err := adm.ListTopics(ctx, e.cfg.topics...)
	if err != nil {
		e.log.Warn("kpar: cannot list topics to create retry topics", "err", err)
		return
	}
	for _, t := range e.cfg.topics {
		d, ok := details[t]
		if !ok || d.Err != nil {
			continue
		}
		var missing []string
		for n := range e.cfg.retryTopics {
			missing = append(missing, RetryTopic(t, n+1))
		}
		resps, err := adm.CreateTopics(ctx, int32(len(d.Partitions)), -1, nil, missing...)
		if err != nil {
			e.log.Warn("kpar: cannot create retry topics", "topic", t, "err", err)
			continue
		}
		for _, r := range resps.Sorted() {
			if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
				e.log.Warn("kpar: cannot create retry topic", "topic", r.Topic, "err", r.Err)
			}
		}
	}
}

// retryState is what a retry record says beyond its original: the codec
// of encodeRetry and decodeRetryHeaders.
type retryState struct {
	Group        string
	Level        int       // n of <topic>.retry.<n>, from 1
	Due          time.Time // not handled before
	Attempts     int       // attempts so far, over all levels
	FirstFailure time.Time
	LastFailure  time.Time
	Class        deadletter.Class
	Message      string // the last error's text
}

// encodeRetry returns the headers of the retry record of orig: orig's own
// headers, then the level (which starts the retry headers), the due time,
// and the dead-letter headers of orig and s.
func encodeRetry(orig *kgo.Record, s retryState) []kgo.RecordHeader {
	hs := append([]kgo.RecordHeader(nil), orig.Headers...)
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderRetryLevel, Value: strconv.AppendInt(nil, int64(s.Level), 10)},
		kgo.RecordHeader{Key: HeaderRetryDue, Value: appendTime(nil, s.Due)},
	)
	return append(hs, deadletter.EncodeHeaders(deadletter.Letter{
		Record: orig, Group: s.Group, Class: s.Class, Message: s.Message,
		Attempts: s.Attempts, FirstFailure: s.FirstFailure, LastFailure: s.LastFailure,
	}, deadletter.Kpar)...)
}

// errRetryHeaders wraps every error of decodeRetryHeaders.
var errRetryHeaders = errors.New("kpar: bad retry-topic headers")

// decodeRetryHeaders is the inverse of encodeRetry: from the headers of a
// retry record it restores the original's location, timestamp and headers
// into orig (whose key and value the caller sets) and returns the state. The
// retry headers start at the last HeaderRetryLevel, so an original that
// carried such names itself keeps them. A missing location,
// level or due time, or a value that does not parse, is an error wrapping
// errRetryHeaders; orig then holds what could be read.
func decodeRetryHeaders(hs []kgo.RecordHeader, orig *kgo.Record) (retryState, error) {
	var s retryState
	start := len(hs)
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == HeaderRetryLevel {
			start = i
			break
		}
	}
	seen := make(map[string]bool, 12)
	orig.Headers = nil
	if start > 0 {
		orig.Headers = append([]kgo.RecordHeader(nil), hs[:start]...)
	}
	var errs []error
	bad := func(k, v string, err error) {
		errs = append(errs, fmt.Errorf("%s=%q: %w", k, v, err))
	}
	num := func(k, v string, bits int) int64 {
		n, err := strconv.ParseInt(v, 10, bits)
		if err != nil {
			bad(k, v, err)
		}
		return n
	}
	tm := func(k, v string) time.Time {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			bad(k, v, err)
		}
		return t
	}
	for _, h := range hs[start:] {
		k, v := h.Key, string(h.Value)
		seen[k] = true
		switch k {
		case deadletter.HeaderTopic:
			orig.Topic = v
		case deadletter.HeaderPartition:
			orig.Partition = int32(num(k, v, 32))
		case deadletter.HeaderOffset:
			orig.Offset = num(k, v, 64)
		case deadletter.HeaderOriginalTimestamp:
			orig.Timestamp = tm(k, v)
		case deadletter.HeaderGroup:
			s.Group = v
		case deadletter.HeaderDeliveryCount:
			s.Attempts = int(num(k, v, 32))
		case deadletter.HeaderMessage:
			s.Message = v
		case deadletter.HeaderClass:
			if s.Class = deadletter.Class(v); !s.Class.Valid() {
				bad(k, v, errors.New("unknown class"))
			}
		case deadletter.HeaderFirstFailure:
			s.FirstFailure = tm(k, v)
		case deadletter.HeaderLastFailure:
			s.LastFailure = tm(k, v)
		case HeaderRetryLevel:
			if s.Level = int(num(k, v, 32)); s.Level < 1 {
				bad(k, v, errors.New("want 1 or more"))
			}
		case HeaderRetryDue:
			s.Due = tm(k, v)
		}
	}
	for _, k := range []string{deadletter.HeaderTopic, deadletter.HeaderPartition, deadletter.HeaderOffset, HeaderRetryLevel, HeaderRetryDue} {
		if !seen[k] {
			errs = append(errs, fmt.Errorf("no %s header", k))
		}
	}
	if len(errs) > 0 {
		return s, fmt.Errorf("%w: %w", errRetryHeaders, errors.Join(errs...))
	}
	return s, nil
}

// appendTime appends t as RFC 3339 with milliseconds in UTC, the dead-letter
// headers' format; nothing for a zero t.
func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	return t.UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z07:00")
}

// decodeRetry reads the retry headers of a record consumed from retry topic
// level n into it: its due time, its history, and the original record the
// handler sees. Damaged headers make the record due now, with what could
// be read; the error is returned and kept as the record's last error, so a
// dead letter of it says why its history is incomplete.
func decodeRetry(it *item, level int) error {
	x := it.ext()
	x.level = level
	orig := *it.rec
	s, err := decodeRetryHeaders(it.rec.Headers, &orig)
	x.due, x.priorAttempts, x.firstFailure = s.Due, s.Attempts, s.FirstFailure
	x.origin = &orig
	if err != nil {
		x.lastErr = fmt.Errorf("%s/%d/%d: %w", it.rec.Topic, it.rec.Partition, it.rec.Offset, err)
		return x.lastErr
	}
	return nil
}

// writeRetries produces records to their next retry topic and waits for the
// acknowledgements. It returns the records the topic (or the producer)
// refused as too large, marked for the dead letters: no retry makes them
// fit, and waiting for one would hold their partitions for ever.
func (e *engine) writeRetries(ctx context.Context, ts []*task) (refused []*task, err error) {
	if len(ts) == 0 {
		return nil, nil
	}
	now := time.Now()
	recs := make([]*kgo.Record, len(ts))
	for i, t := range ts {
		it := &t.Value
		x := it.ext()
		orig := it.original()
		next := x.level + 1
		due := now.Add(e.cfg.retryTopics[next-1])
		msg := ""
		if x.lastErr != nil {
			msg = x.lastErr.Error()
		}
		hs := encodeRetry(orig, retryState{
			Group: e.cfg.group, Level: next, Due: due, Attempts: it.totalAttempts(),
			FirstFailure: x.firstFailure, LastFailure: x.lastFailure, Class: x.class, Message: msg,
		})
		recs[i] = &kgo.Record{
			Topic:     RetryTopic(orig.Topic, next),
			Key:       orig.Key,
			Value:     orig.Value,
			Headers:   hs,
			Timestamp: now,
		}
	}
	if e.out != nil && e.out.eos {
		// They join the transaction that commits their records.
		for i, t := range ts {
			x := t.Value.x
			l := t.Value.letter(e.cfg.letterGroup())
			x.outputs, x.outKind, x.outLetter = append(x.outputs, recs[i]), outRetry, &l
		}
	} else {
		results := e.producer.ProduceSync(ctx, recs...)
		tooBig := make([]error, len(recs))
		for i, r := range results {
			switch {
			case r.Err == nil:
			case errors.Is(r.Err, kerr.MessageTooLarge) || errors.Is(r.Err, kerr.RecordListTooLarge):
				tooBig[i] = r.Err
			default:
				return nil, fmt.Errorf("producing to retry topics: %w", r.Err)
			}
		}
		for i, t := range ts {
			if tooBig[i] == nil {
				continue
			}
			refused = append(refused, t)
			e.log.Warn("kpar: the retry topic refused a record as too large; it goes to the dead letters instead (raise the retry topic's max.message.bytes to keep such records retrying)",
				"topic", recs[i].Topic, "original_offset", t.Value.original().Offset, "err", tooBig[i])
		}
		if refused != nil {
			e.mu.Lock()
			for i, t := range ts {
				if x := t.Value.x; tooBig[i] != nil {
					x.retryRefused = true
					refusal := fmt.Errorf("its retry topic %s refused it as too large: %w", recs[i].Topic, tooBig[i])
					if x.lastErr != nil {
						refusal = fmt.Errorf("%w; %w", x.lastErr, refusal)
					}
					x.lastErr = refusal
				}
			}
			e.mu.Unlock()
		}
	}
	for i, t := range ts {
		if !t.Value.x.retryRefused {
			e.log.Info("kpar: record sent to retry topic", "topic", recs[i].Topic,
				"original_offset", t.Value.original().Offset, "due_in", e.cfg.retryTopics[t.Value.level()])
		}
	}
	return refused, nil
}
