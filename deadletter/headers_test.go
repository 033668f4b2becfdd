package deadletter

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func hdr(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }

func be32(n int32) string { return string(binary.BigEndian.AppendUint32(nil, uint32(n))) }
func be64(n int64) string { return string(binary.BigEndian.AppendUint64(nil, uint64(n))) }

// dlqRecord is a record as read from a dead-letter topic.
func dlqRecord(topic string, ts time.Time, hs ...kgo.RecordHeader) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: 0, Offset: 99, Key: []byte("key"), Value: []byte("value"),
		Timestamp: ts, Headers: hs}
}

// TestSourceDecodesConnectHeaders decodes a record as Kafka Connect's
// DeadLetterQueueReporter writes it: the original headers, then the
// __connect.errors.* context headers.
func TestSourceDecodesConnectHeaders(t *testing.T) {
	failedAt := ms("2024-03-04T05:06:07.008Z")
	r := dlqRecord("dlq-s3", failedAt,
		hdr("trace", "t-1"),
		hdr(ConnectTopic, "orders"),
		hdr(ConnectPartition, "2"),
		hdr(ConnectOffset, "41"),
		hdr(ConnectConnectorName, "s3-sink"),
		hdr(ConnectTaskID, "0"),
		hdr(ConnectStage, "VALUE_CONVERTER"),
		hdr(ConnectClassName, "org.apache.kafka.connect.json.JsonConverter"),
		hdr(ConnectExceptionClass, "org.apache.kafka.connect.errors.DataException"),
		hdr(ConnectExceptionMessage, "Converting byte[] to Kafka Connect data failed due to serialization error"),
		hdr(ConnectExceptionStacktrace, "org.apache.kafka.connect.errors.DataException: ...\n\tat ..."),
	)
	want := Letter{
		Record: &kgo.Record{Topic: "orders", Partition: 2, Offset: 41, Key: []byte("key"), Value: []byte("value"),
			Headers: []kgo.RecordHeader{hdr("trace", "t-1")}},
		Group:       "connect-s3-sink",
		Class:       ClassPermanent,
		Message:     "Converting byte[] to Kafka Connect data failed due to serialization error",
		LastFailure: failedAt,
	}
	if d := diffLetter(want, FromRecord(r)); d != "" {
		t.Fatal(d)
	}

	// An exception that says nothing about retrying.
	r.Headers[8] = hdr(ConnectExceptionClass, "org.apache.kafka.connect.errors.ConnectException")
	if got := FromRecord(r).Class; got != ClassUnknown {
		t.Errorf("ConnectException decoded as %q, want %q", got, ClassUnknown)
	}
}

// TestSourceDecodesStreamsHeaders decodes a record as Kafka Streams
// (KIP-1034) writes it: the original timestamp, __streams.errors.* headers,
// no original headers.
func TestSourceDecodesStreamsHeaders(t *testing.T) {
	origTS := ms("2024-03-04T01:02:03.004Z")
	r := dlqRecord("app-dlq", origTS,
		hdr(StreamsException, "org.apache.kafka.common.errors.SerializationException: Size of data received by LongDeserializer is not 8"),
		hdr(StreamsMessage, "Size of data received by LongDeserializer is not 8"),
		hdr(StreamsStacktrace, "org.apache.kafka.common.errors.SerializationException: ...\n\tat ..."),
		hdr(StreamsTopic, "clicks"),
		hdr(StreamsPartition, "7"),
		hdr(StreamsOffset, "123456"),
	)
	want := Letter{
		Record: &kgo.Record{Topic: "clicks", Partition: 7, Offset: 123456, Key: []byte("key"), Value: []byte("value"),
			Timestamp: origTS},
		Class:   ClassPermanent,
		Message: "Size of data received by LongDeserializer is not 8",
	}
	if d := diffLetter(want, FromRecord(r)); d != "" {
		t.Fatal(d)
	}
	for exc, class := range map[string]Class{
		"org.apache.kafka.common.errors.TimeoutException: Expiring 1 record(s)": ClassTimeout,
		"java.lang.IllegalStateException: boom":                                 ClassUnknown,
		"java.lang.StackOverflowError":                                          ClassPanic,
	} {
		r.Headers[0] = hdr(StreamsException, exc)
		if got := FromRecord(r).Class; got != class {
			t.Errorf("%s decoded as %q, want %q", exc, got, class)
		}
	}
}

// TestSourceDecodesSpringHeaders decodes a record as Spring Kafka's
// DeadLetterPublishingRecoverer writes it after non-blocking retries.
func TestSourceDecodesSpringHeaders(t *testing.T) {
	origTS := ms("2024-03-04T01:02:03.004Z")
	r := dlqRecord("orders-dlt", origTS,
		hdr("traceparent", "00-abc-def-01"),
		hdr(SpringRetryAttempts, be32(3)),
		hdr(SpringExceptionFQCN, "org.springframework.kafka.listener.ListenerExecutionFailedException"),
		hdr(SpringExceptionCauseFQCN, "org.springframework.kafka.support.serializer.DeserializationException"),
		hdr(SpringExceptionMessage, "Listener failed; failed to deserialize"),
		hdr(SpringExceptionStacktrace, "org.springframework...\n\tat ..."),
		hdr(SpringOriginalTopic, "orders-retry-1"),
		hdr(SpringOriginalPartition, be32(4)),
		hdr(SpringOriginalOffset, be64(1<<40)),
		hdr(SpringOriginalTimestamp, be64(origTS.UnixMilli())),
		hdr(SpringOriginalTimestampType, "CreateTime"),
		hdr(SpringOriginalConsumerGroup, "orders-svc"),
	)
	want := Letter{
		Record: &kgo.Record{Topic: "orders-retry-1", Partition: 4, Offset: 1 << 40, Key: []byte("key"), Value: []byte("value"),
			Timestamp: origTS,
			Headers:   []kgo.RecordHeader{hdr("traceparent", "00-abc-def-01"), hdr(SpringRetryAttempts, be32(3))}},
		Group:    "orders-svc",
		Class:    ClassPermanent,
		Message:  "Listener failed; failed to deserialize",
		Attempts: 3,
	}
	if d := diffLetter(want, FromRecord(r)); d != "" {
		t.Fatal(d)
	}

	// A plain failure after Spring's retries: exhausted.
	r.Headers[3] = hdr(SpringExceptionCauseFQCN, "java.lang.RuntimeException")
	if got := FromRecord(r).Class; got != ClassExhausted {
		t.Errorf("RuntimeException decoded as %q, want %q", got, ClassExhausted)
	}
}

// TestSourceDecodesLastDialect: a Connect dead letter that a kpar consumer
// dead-lettered again keeps Connect's headers among the original headers,
// and a kpar dead letter dead-lettered again by kpar loses only the last
// copy of each kpar header.
func TestSourceDecodesLastDialect(t *testing.T) {
	connect := []kgo.RecordHeader{hdr(ConnectTopic, "orders"), hdr(ConnectPartition, "1"), hdr(ConnectOffset, "5")}
	inner := letterAt("orders-dlq-connect", 0, 17)
	inner.Record.Headers = connect
	r := dlqRecord("orders-dlq-connect.dlq", time.Now(),
		append(append([]kgo.RecordHeader{}, connect...), EncodeHeaders(inner, Kpar)...)...)
	r.Key, r.Value = inner.Record.Key, inner.Record.Value
	if d := diffLetter(inner, FromRecord(r)); d != "" {
		t.Fatal(d)
	}

	// A dead letter of a dead letter, both kpar's.
	first := letterAt("orders", 3, 8)
	firstHeaders := EncodeHeaders(first, Kpar)
	second := letterAt("orders.dlq", 1, 2)
	second.Record.Headers = firstHeaders
	second.Class, second.Message = ClassPermanent, "replay handler rejected it"
	r = dlqRecord("orders.dlq.dlq", time.Now(), append(append([]kgo.RecordHeader{}, firstHeaders...), EncodeHeaders(second, Kpar)...)...)
	r.Key, r.Value = second.Record.Key, second.Record.Value
	got := FromRecord(r)
	if d := diffLetter(second, got); d != "" {
		t.Fatal(d)
	}
	if d := diffLetter(first, FromRecord(got.Record)); d != "" {
		t.Fatalf("inner dead letter: %s", d)
	}
}

func TestSourceDecodesPlainRecord(t *testing.T) {
	r := dlqRecord("whatever", ms("2024-01-01T00:00:00Z"), hdr("a", "b"))
	l := FromRecord(r)
	if l.Class != ClassUnknown || l.Record.Topic != "whatever" || l.Record.Offset != 99 || len(l.Record.Headers) != 1 {
		t.Fatalf("plain record decoded as %+v / %+v", l, l.Record)
	}
}

func TestDeadLetterClassFromException(t *testing.T) {
	for fqcn, want := range map[string]Class{
		"kpar.error.timeout":                                                 ClassTimeout,
		"kpar.error.bogus":                                                   ClassUnknown,
		"java.net.SocketTimeoutException":                                    ClassTimeout,
		"org.apache.kafka.common.errors.RecordTooLargeException":             ClassPermanent,
		"org.springframework.messaging.converter.MessageConversionException": ClassPermanent,
		"java.lang.ClassCastException":                                       ClassPermanent,
		"com.fasterxml.jackson.core.JsonParseException":                      ClassPermanent,
		"java.lang.OutOfMemoryError":                                         ClassPanic,
		"com.example.Outer$InnerTimeoutException":                            ClassTimeout,
		"java.lang.RuntimeException":                                         ClassUnknown,
		"":                                                                   ClassUnknown,
	} {
		if got := classify(fqcn, ClassUnknown); got != want {
			t.Errorf("classify(%q) = %q, want %q", fqcn, got, want)
		}
	}
}

// TestDeadLetterHeadersOmitUnknownTimes: zero times are left out, and
// decode back as zero.
func TestDeadLetterHeadersOmitUnknownTimes(t *testing.T) {
	l := Letter{Record: &kgo.Record{Topic: "t", Partition: 1, Offset: 2}, Class: ClassPermanent, Message: "m"}
	for _, d := range []HeaderDialect{Kpar, Spring} {
		hs := EncodeHeaders(l, d)
		for _, h := range hs {
			switch h.Key {
			case HeaderFirstFailure, HeaderLastFailure, HeaderOriginalTimestamp, SpringOriginalTimestamp:
				t.Errorf("dialect %d wrote %s for a zero time", d, h.Key)
			}
		}
		got := FromRecord(&kgo.Record{Topic: "t.dlq", Headers: hs})
		if diff := diffLetter(l, got); diff != "" {
			t.Errorf("dialect %d: %s", d, diff)
		}
	}
}
