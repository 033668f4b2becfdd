package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A dead letter is as large as the record it carries, and the record was
// produced to a topic whose size limit may be higher than the dead-letter
// topic's (or than the producer's ProducerBatchMaxBytes, 1 MB by default).
// Retrying such a letter can never succeed: without the steps below the
// record would stay unfinished, and its partition's commits stuck, for
// ever. So the sink writes what it can, and says what it left out.

// bigHeader is the size (name and value) above which an original header is
// dropped at the shrink stage that drops the largest headers.
const bigHeader = 1 << 10

// shortMessage is how much of the error message the last stage keeps.
const shortMessage = 1 << 10

// tooLarge reports whether err is the broker's or the client's refusal of
// a record for its size.
func tooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// shrinkStages is how far a refused dead letter is cut, cumulatively:
//
//  1. the value left out;
//  2. the key left out too, and every original header larger than 1 KiB
//     (name and value);
//  3. every original header left out, and the error message cut to its
//     first KiB.
const shrinkStages = 3

// shrunk is letter l cut to stage (0: whole), with the headers that say
// what was cut, and cuts, the number of parts cut (to tell a stage that
// cuts nothing more from the one before).
func shrunk(l Letter, stage int) (cut Letter, marks []kgo.RecordHeader, cuts int) {
	r := *l.Record
	cut = l
	cut.Record = &r
	mark := func(k, v string) { marks = append(marks, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	if stage >= 1 && len(r.Value) > 0 {
		mark(HeaderValueTruncated, "true")
		mark(HeaderValueOriginalBytes, strconv.Itoa(len(r.Value)))
		r.Value = nil
		cuts++
	}
	if stage >= 2 && len(r.Key) > 0 {
		mark(HeaderKeyTruncated, "true")
		mark(HeaderKeyOriginalBytes, strconv.Itoa(len(r.Key)))
		r.Key = nil
		cuts++
	}
	if stage >= 2 && len(r.Headers) > 0 {
		var kept []kgo.RecordHeader
		var dropped []string
		for _, h := range r.Headers {
			if stage >= 3 || len(h.Key)+len(h.Value) > bigHeader {
				dropped = append(dropped, h.Key)
				continue
			}
			kept = append(kept, h)
		}
		if len(dropped) > 0 {
			mark(HeaderHeadersDropped, strings.Join(dropped, ","))
			r.Headers = kept
			cuts += len(dropped)
		}
	}
	if stage >= 3 && len(l.Message) > shortMessage {
		mark(HeaderMessageTruncated, "true")
		cut.Message = cutUTF8(l.Message, shortMessage) + fmt.Sprintf(" … (cut from %d bytes)", len(l.Message))
		cuts++
	}
	return cut, marks, cuts
}

// cutUTF8 is s cut to at most n bytes, not inside a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// writeShrunk writes l, which the broker refused (refusal) as too large,
// again, alone and cut further at each refusal (see shrinkStages). alone
// says the refused write held l alone: a letter refused within a batch is
// first tried alone and whole, as the batch may have been too large rather
// than the letter.
func (s *KafkaSink) writeShrunk(ctx context.Context, l Letter, partition int32, alone bool, refusal error) error {
	topic := s.topic(l.Record.Topic)
	first := 1
	if !alone {
		first = 0
	}
	prev := 0
	for stage := first; stage <= shrinkStages; stage++ {
		cut, marks, cuts := shrunk(l, stage)
		if stage > 0 && cuts == prev {
			continue // nothing more to cut at this stage
		}
		prev = cuts
		rec := s.record(ctx, cut, marks)
		rec.Partition = partition
		err := s.cl.ProduceSync(ctx, rec).FirstErr()
		if err == nil {
			if stage > 0 {
				s.warnCut(l, topic, marks, refusal)
			}
			return nil
		}
		if !tooLarge(err) {
			return fmt.Errorf("deadletter: producing the dead letter of %s cut to fit %s: %w", l.ID(), topic, err)
		}
		refusal = err
	}
	return fmt.Errorf("deadletter: %s refuses the dead letter of %s as too large even with its value, key and headers left out and its message cut (%w): raise the max.message.bytes of %[1]s (and the producer's ProducerBatchMaxBytes), or use another sink", topic, l.ID(), refusal)
}

// warnCut logs, once per letter written, what was left out of it.
func (s *KafkaSink) warnCut(l Letter, topic string, marks []kgo.RecordHeader, refusal error) {
	var left []string
	attrs := []any{"topic", topic, "record", l.ID(), "group", l.Group}
	for _, m := range marks {
		switch m.Key {
		case HeaderValueTruncated:
			left = append(left, "value")
		case HeaderValueOriginalBytes:
			attrs = append(attrs, "value_bytes", string(m.Value))
		case HeaderKeyTruncated:
			left = append(left, "key")
		case HeaderKeyOriginalBytes:
			attrs = append(attrs, "key_bytes", string(m.Value))
		case HeaderHeadersDropped:
			left = append(left, "headers "+string(m.Value))
		case HeaderMessageTruncated:
			left = append(left, "most of the error message")
		}
	}
	attrs = append(attrs, "left_out", strings.Join(left, "; "), "refusal", refusal.Error())
	s.log.Warn("deadletter: dead letter too large for its topic, written without part of the record (see its kpar.*.truncated headers); the whole record stays only in the source topic, while its retention keeps it", attrs...)
}
