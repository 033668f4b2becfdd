package kpar

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// FuzzRetryHeaders: whatever the original record and the retry state,
// decodeRetryHeaders(encodeRetry(...)) gives them back, headers included,
// even when the original itself carries dead-letter header names.
func FuzzRetryHeaders(f *testing.F) {
	f.Add("orders", int32(3), int64(42), int64(1_700_000_000_123), "trace", []byte("abc"), 2, 5, "exhausted", "boom\n", int64(250))
	f.Add("", int32(0), int64(0), int64(0), deadletter.HeaderTopic, []byte(nil), 1, 1, "permanent", "", int64(0))
	f.Add("ü.topic", int32(-1), int64(-2), int64(-5), deadletter.HeaderLastFailure, []byte{0xff}, 9, 0, "panic", "\x00", int64(-1))
	f.Add("t", int32(1), int64(1), int64(1), HeaderRetryLevel, []byte("x"), 1, 1, "timeout", "m", int64(1))
	f.Fuzz(func(t *testing.T, topic string, partition int32, offset, tsMillis int64, hk string, hv []byte,
		level, attempts int, class, msg string, firstMillis int64) {
		if level < 1 || attempts < 0 || !deadletter.Class(class).Valid() {
			t.Skip()
		}
		ms := func(n int64) time.Time {
			if n == 0 {
				return time.Time{}
			}
			return time.UnixMilli(n % (1 << 40)).UTC() // within years RFC 3339 can write
		}
		orig := &kgo.Record{Topic: topic, Partition: partition, Offset: offset, Timestamp: ms(tsMillis),
			Headers: []kgo.RecordHeader{{Key: "first", Value: []byte("x")}, {Key: hk, Value: hv}}}
		want := retryState{Group: "g", Level: level, Due: ms(tsMillis + 1000), Attempts: attempts,
			FirstFailure: ms(firstMillis), Class: deadletter.Class(class), Message: msg}
		if want.Due.IsZero() {
			want.Due = time.UnixMilli(1).UTC()
		}
		var got kgo.Record
		s, err := decodeRetryHeaders(encodeRetry(orig, want), &got)
		if err != nil {
			t.Fatalf("decoding what was encoded: %v", err)
		}
		if s != want {
			t.Fatalf("state %+v, want %+v", s, want)
		}
		if got.Topic != orig.Topic || got.Partition != orig.Partition || got.Offset != orig.Offset || !got.Timestamp.Equal(orig.Timestamp) {
			t.Fatalf("original %s/%d/%d@%v, want %s/%d/%d@%v", got.Topic, got.Partition, got.Offset, got.Timestamp,
				orig.Topic, orig.Partition, orig.Offset, orig.Timestamp)
		}
		if !slices.EqualFunc(got.Headers, orig.Headers, func(a, b kgo.RecordHeader) bool {
			return a.Key == b.Key && string(a.Value) == string(b.Value)
		}) {
			t.Fatalf("headers %q, want %q", got.Headers, orig.Headers)
		}
	})
}

// TestRetryHeadersRejectBadValues: a retry record whose headers are
// missing or do not parse decodes to an error naming the header, with the
// rest read.
func TestRetryHeadersRejectBadValues(t *testing.T) {
	orig := &kgo.Record{Topic: "orders", Partition: 1, Offset: 7, Timestamp: time.UnixMilli(1_700_000_000_000)}
	good := encodeRetry(orig, retryState{Level: 1, Due: time.UnixMilli(1_700_000_001_000), Attempts: 3, Class: deadletter.ClassExhausted})
	set := func(k, v string) []kgo.RecordHeader {
		hs := slices.Clone(good)
		for i := range hs {
			if hs[i].Key == k {
				hs[i].Value = []byte(v)
			}
		}
		return hs
	}
	drop := func(k string) []kgo.RecordHeader {
		return slices.DeleteFunc(slices.Clone(good), func(h kgo.RecordHeader) bool { return h.Key == k })
	}
	for _, tc := range []struct {
		name string
		hs   []kgo.RecordHeader
		want string
	}{
		{"partition not a number", set(deadletter.HeaderPartition, "one"), deadletter.HeaderPartition},
		{"partition too large", set(deadletter.HeaderPartition, "4294967296"), deadletter.HeaderPartition},
		{"offset not a number", set(deadletter.HeaderOffset, "7x"), deadletter.HeaderOffset},
		{"attempts not a number", set(deadletter.HeaderDeliveryCount, ""), deadletter.HeaderDeliveryCount},
		{"level zero", set(HeaderRetryLevel, "0"), HeaderRetryLevel},
		{"due not a time", set(HeaderRetryDue, "1700000001000"), HeaderRetryDue},
		{"timestamp not a time", set(deadletter.HeaderOriginalTimestamp, "yesterday"), deadletter.HeaderOriginalTimestamp},
		{"unknown class", set(deadletter.HeaderClass, "bored"), deadletter.HeaderClass},
		{"no due", drop(HeaderRetryDue), "no " + HeaderRetryDue},
		{"no topic", drop(deadletter.HeaderTopic), "no " + deadletter.HeaderTopic},
		{"no headers", nil, "no " + HeaderRetryLevel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got kgo.Record
			_, err := decodeRetryHeaders(tc.hs, &got)
			if !errors.Is(err, errRetryHeaders) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want errRetryHeaders naming %q", err, tc.want)
			}
		})
	}
	var got kgo.Record
	if _, err := decodeRetryHeaders(good, &got); err != nil || got.Offset != 7 {
		t.Fatalf("good headers: offset %d, %v", got.Offset, err)
	}
}
