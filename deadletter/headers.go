package deadletter

import (
	"encoding/binary"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kpar's default header dialect: Kafka's own dead-letter names (KIP-1191,
// the share-group DLQ, in the style of Kafka Connect's __connect.errors.*),
// values as UTF-8 strings so that `kcat -f '%h'` shows them.
const (
	HeaderTopic         = "__dlq.errors.topic"          // original topic
	HeaderPartition     = "__dlq.errors.partition"      // original partition, decimal
	HeaderOffset        = "__dlq.errors.offset"         // original offset, decimal
	HeaderGroup         = "__dlq.errors.group"          // consumer group
	HeaderDeliveryCount = "__dlq.errors.delivery.count" // attempts, decimal
	HeaderMessage       = "__dlq.errors.message"        // the last error's text

	HeaderClass             = "kpar.error.class"        // permanent|exhausted|timeout|panic
	HeaderFirstFailure      = "kpar.first.failure"      // RFC 3339, milliseconds, UTC
	HeaderLastFailure       = "kpar.last.failure"       // RFC 3339, milliseconds, UTC
	HeaderOriginalTimestamp = "kpar.original.timestamp" // RFC 3339, milliseconds, UTC

	// HeaderKparDeliveryCount carries Attempts in the Spring dialect, whose
	// headers have no delivery count.
	HeaderKparDeliveryCount = "kpar.delivery.count"
)

// Headers a KafkaSink adds, in both dialects, to a dead letter the broker
// (or the client's ProducerBatchMaxBytes) refused as too large and that it
// wrote again with parts of the original left out (see KafkaSink). Values
// are UTF-8 strings. Readers keep them among the letter's headers, so that
// Letter.Truncated reports the cut and Replay does not send a record with
// a part missing.
const (
	HeaderValueTruncated     = "kpar.value.truncated"      // "true": the value is left out (nil)
	HeaderValueOriginalBytes = "kpar.value.original.bytes" // the original value's size, decimal
	HeaderKeyTruncated       = "kpar.key.truncated"        // "true": the key is left out (nil)
	HeaderKeyOriginalBytes   = "kpar.key.original.bytes"   // the original key's size, decimal
	// HeaderHeadersDropped lists the names of the original headers left
	// out, comma-separated, in their order.
	HeaderHeadersDropped = "kpar.headers.dropped"
	// HeaderMessageTruncated is "true" when the error message header holds
	// only the start of the error.
	HeaderMessageTruncated = "kpar.message.truncated"
)

// Spring Kafka's dead-letter headers (KafkaHeaders.DLT_*), written by
// DeadLetterPublishingRecoverer. Numbers are big-endian binary: partition 4
// bytes, offset and timestamp 8 bytes (milliseconds since the epoch); the
// others are UTF-8 strings, the timestamp type "CreateTime" or
// "LogAppendTime".
const (
	SpringOriginalTopic         = "kafka_dlt-original-topic"
	SpringOriginalPartition     = "kafka_dlt-original-partition"
	SpringOriginalOffset        = "kafka_dlt-original-offset"
	SpringOriginalTimestamp     = "kafka_dlt-original-timestamp"
	SpringOriginalTimestampType = "kafka_dlt-original-timestamp-type"
	SpringOriginalConsumerGroup = "kafka_dlt-original-consumer-group"
	SpringExceptionFQCN         = "kafka_dlt-exception-fqcn"
	SpringExceptionCauseFQCN    = "kafka_dlt-exception-cause-fqcn"
	SpringExceptionMessage      = "kafka_dlt-exception-message"
	SpringExceptionStacktrace   = "kafka_dlt-exception-stacktrace"
	// SpringRetryAttempts is set by Spring's non-blocking retries (retry
	// topics), 4 bytes big-endian; the reader takes Attempts from it.
	SpringRetryAttempts = "retry_topic-attempts"
)

// Kafka Connect's dead-letter headers (DeadLetterQueueReporter, with
// errors.deadletterqueue.context.headers.enable=true), UTF-8 strings.
const (
	ConnectTopic               = "__connect.errors.topic"
	ConnectPartition           = "__connect.errors.partition"
	ConnectOffset              = "__connect.errors.offset"
	ConnectConnectorName       = "__connect.errors.connector.name"
	ConnectTaskID              = "__connect.errors.task.id"
	ConnectStage               = "__connect.errors.stage"
	ConnectClassName           = "__connect.errors.class.name"
	ConnectExceptionClass      = "__connect.errors.exception.class.name"
	ConnectExceptionMessage    = "__connect.errors.exception.message"
	ConnectExceptionStacktrace = "__connect.errors.exception.stacktrace"
)

// Kafka Streams' dead-letter headers (KIP-1034, errors.dead.letter.queue.topic.name),
// UTF-8 strings. StreamsException holds the exception's toString(): its
// class name, then ": " and the message when there is one.
const (
	StreamsException  = "__streams.errors.exception"
	StreamsMessage    = "__streams.errors.message"
	StreamsStacktrace = "__streams.errors.stacktrace"
	StreamsTopic      = "__streams.errors.topic"
	StreamsPartition  = "__streams.errors.partition"
	StreamsOffset     = "__streams.errors.offset"
)

// Replay markers, added by Replay to every record it sends back.
const (
	// HeaderReplayedFrom is the replayed dead letter's ID: its original
	// record's "topic/partition/offset".
	HeaderReplayedFrom = "kpar-replayed-from"
	// HeaderReplayRun is the run id of the replay that sent the record.
	HeaderReplayRun = "kpar-replay-run"
)

// HeaderDialect is a set of header names and encodings for dead letters
// written to Kafka.
type HeaderDialect int

const (
	// Kpar writes the __dlq.errors.* headers plus kpar's own kpar.*
	// headers, all UTF-8 strings. The default.
	Kpar HeaderDialect = iota
	// Spring writes Spring Kafka's kafka_dlt-* headers (binary big-endian
	// numbers, as Spring expects) so that a Spring service can consume
	// kpar's dead letters, plus kpar.error.class, kpar.delivery.count,
	// kpar.first.failure and kpar.last.failure, for which Spring has no
	// header; Spring ignores them and kpar's reader uses them, so nothing is
	// lost in the round trip. kafka_dlt-exception-fqcn is
	// "kpar.error.<class>", and kafka_dlt-exception-stacktrace repeats the
	// message (a panic's message holds its goroutine stack).
	Spring
)

// timeLayout is RFC 3339 with milliseconds, the precision of Kafka
// timestamps.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

func formatTime(t time.Time) []byte { return []byte(t.UTC().Format(timeLayout)) }

func parseTime(b []byte) time.Time {
	t, err := time.Parse(time.RFC3339Nano, string(b))
	if err != nil {
		return time.Time{}
	}
	return t
}

// springFQCNPrefix marks the exception class kpar writes in the Spring
// dialect: "kpar.error.exhausted" and so on.
const springFQCNPrefix = "kpar.error."

// EncodeHeaders returns the dead-letter headers that describe l in dialect
// d: the headers a KafkaSink appends after the original record's headers.
// Zero times are left out.
func EncodeHeaders(l Letter, d HeaderDialect) []kgo.RecordHeader {
	r := l.Record
	if r == nil {
		r = new(kgo.Record)
	}
	var hs []kgo.RecordHeader
	add := func(k string, v []byte) { hs = append(hs, kgo.RecordHeader{Key: k, Value: v}) }
	addTime := func(k string, t time.Time) {
		if !t.IsZero() {
			add(k, formatTime(t))
		}
	}
	switch d {
	case Spring:
		add(SpringOriginalTopic, []byte(r.Topic))
		add(SpringOriginalPartition, binary.BigEndian.AppendUint32(nil, uint32(r.Partition)))
		add(SpringOriginalOffset, binary.BigEndian.AppendUint64(nil, uint64(r.Offset)))
		if !r.Timestamp.IsZero() {
			add(SpringOriginalTimestamp, binary.BigEndian.AppendUint64(nil, uint64(r.Timestamp.UnixMilli())))
			tsType := "CreateTime"
			if r.Attrs.TimestampType() == 1 {
				tsType = "LogAppendTime"
			}
			add(SpringOriginalTimestampType, []byte(tsType))
		}
		add(SpringOriginalConsumerGroup, []byte(l.Group))
		add(SpringExceptionFQCN, []byte(springFQCNPrefix+string(l.Class)))
		add(SpringExceptionMessage, []byte(l.Message))
		add(SpringExceptionStacktrace, []byte(l.Message))
		add(HeaderClass, []byte(l.Class))
		add(HeaderKparDeliveryCount, []byte(strconv.Itoa(l.Attempts)))
		addTime(HeaderFirstFailure, l.FirstFailure)
		addTime(HeaderLastFailure, l.LastFailure)
	default:
		add(HeaderTopic, []byte(r.Topic))
		add(HeaderPartition, []byte(strconv.FormatInt(int64(r.Partition), 10)))
		add(HeaderOffset, []byte(strconv.FormatInt(r.Offset, 10)))
		add(HeaderGroup, []byte(l.Group))
		add(HeaderDeliveryCount, []byte(strconv.Itoa(l.Attempts)))
		add(HeaderMessage, []byte(l.Message))
		add(HeaderClass, []byte(l.Class))
		addTime(HeaderFirstFailure, l.FirstFailure)
		addTime(HeaderLastFailure, l.LastFailure)
		addTime(HeaderOriginalTimestamp, r.Timestamp)
	}
	return hs
}

// dialect of a dead-letter record as found by FromRecord.
type dialect int

const (
	dialectNone dialect = iota
	dialectKpar
	dialectSpring
	dialectConnect
	dialectStreams
)

// dialectOf tells which dialect a header name belongs to.
func dialectOf(name string) dialect {
	switch {
	case strings.HasPrefix(name, "__dlq.errors."):
		return dialectKpar
	case strings.HasPrefix(name, "kafka_dlt-"):
		return dialectSpring
	case strings.HasPrefix(name, "__connect.errors."):
		return dialectConnect
	case strings.HasPrefix(name, "__streams.errors."):
		return dialectStreams
	}
	return dialectNone
}

// kparOwn are the kpar.* headers kpar writes in both of its dialects.
var kparOwn = map[string]bool{
	HeaderClass:             true,
	HeaderFirstFailure:      true,
	HeaderLastFailure:       true,
	HeaderOriginalTimestamp: true,
	HeaderKparDeliveryCount: true,
}

// FromRecord decodes a record read from a dead-letter topic.
//
// It understands kpar's own headers (both dialects), Spring Kafka's
// (kafka_dlt-*), Kafka Connect's (__connect.errors.*) and Kafka Streams'
// (__streams.errors.*). When a record carries several dialects (a dead
// letter that was consumed and dead-lettered again by another framework),
// the one appended last wins, and the headers of the others stay among the
// original headers.
//
// The returned Record carries the original topic, partition, offset and
// timestamp, the dead-letter record's key and value (the same slices), and
// its headers minus the dead-letter headers: for each dead-letter header
// name of the dialect found (and kpar's own kpar.* names, for kpar's
// dialects) the last occurrence is the dead letter's and is removed, so
// headers the original record itself carried survive.
//
// What foreign formats do not say:
//   - Class comes from kpar's headers when present, else from the exception
//     class: kpar.error.<class>; a name containing "Timeout" is
//     ClassTimeout; deserialization, conversion, ClassCast, DataException
//     and similar non-retryable exceptions are ClassPermanent; a Java Error
//     (name ending in "Error") is ClassPanic. Otherwise Spring's dead letters
//     are ClassExhausted (Spring dead-letters after its retries, fatal
//     exceptions aside) and Connect's and Streams' are ClassUnknown.
//   - Attempts: kpar's headers, else Spring's retry_topic-attempts, else 0.
//   - Group: Connect's is "connect-<connector name>" (Connect's default
//     sink group); Streams records none.
//   - Timestamp: Connect records none (zero); Streams' dead-letter record
//     carries the original's timestamp, which is used.
//   - LastFailure: kpar's headers, else the dead-letter record's own
//     timestamp when it differs from the original's (Spring and Streams
//     copy the original timestamp, so then it is unknown, zero).
//     FirstFailure: kpar's headers only.
//
// A record with no dead-letter headers is returned as it is, with
// ClassUnknown.
func FromRecord(r *kgo.Record) Letter {
	d := dialectNone
	for i := len(r.Headers) - 1; i >= 0 && d == dialectNone; i-- {
		d = dialectOf(r.Headers[i].Key)
	}
	orig := &kgo.Record{
		Key:       r.Key,
		Value:     r.Value,
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
		Timestamp: r.Timestamp,
	}
	l := Letter{Record: orig, Class: ClassUnknown}
	if d == dialectNone {
		orig.Headers = r.Headers
		orig.Attrs = r.Attrs
		return l
	}

	// Take the last occurrence of every dead-letter header, and remember
	// where it was to strip it.
	vals := make(map[string][]byte)
	strip := make([]bool, len(r.Headers))
	for i := len(r.Headers) - 1; i >= 0; i-- {
		k := r.Headers[i].Key
		ours := dialectOf(k) == d || (kparOwn[k] && (d == dialectKpar || d == dialectSpring))
		if !ours {
			continue
		}
		if _, dup := vals[k]; dup {
			continue
		}
		vals[k] = r.Headers[i].Value
		strip[i] = true
	}
	for i, h := range r.Headers {
		if !strip[i] {
			orig.Headers = append(orig.Headers, h)
		}
	}
	str := func(k string) string { return string(vals[k]) }
	num := func(k string) int64 { return decodeNumber(vals[k]) }

	fallback := ClassUnknown
	origTS := time.Time{}
	switch d {
	case dialectKpar:
		orig.Topic = str(HeaderTopic)
		orig.Partition = int32(num(HeaderPartition))
		orig.Offset = num(HeaderOffset)
		l.Group = str(HeaderGroup)
		l.Attempts = int(num(HeaderDeliveryCount))
		l.Message = str(HeaderMessage)
	case dialectSpring:
		orig.Topic = str(SpringOriginalTopic)
		orig.Partition = int32(num(SpringOriginalPartition))
		orig.Offset = num(SpringOriginalOffset)
		if v, ok := vals[SpringOriginalTimestamp]; ok {
			origTS = time.UnixMilli(decodeNumber(v))
		}
		l.Group = str(SpringOriginalConsumerGroup)
		l.Message = str(SpringExceptionMessage)
		// Spring wraps the listener's exception in
		// ListenerExecutionFailedException: the cause says more.
		exc := str(SpringExceptionFQCN)
		if cause := str(SpringExceptionCauseFQCN); cause != "" && !strings.HasPrefix(exc, springFQCNPrefix) {
			exc = cause
		}
		l.Class = classify(exc, ClassExhausted)
		// retry_topic-attempts is an ordinary header of the consumed
		// record, so it is read but kept.
		if v := lastHeader(orig.Headers, SpringRetryAttempts); v != nil {
			l.Attempts = int(decodeNumber(v))
		}
	case dialectConnect:
		orig.Topic = str(ConnectTopic)
		orig.Partition = int32(num(ConnectPartition))
		orig.Offset = num(ConnectOffset)
		if name := str(ConnectConnectorName); name != "" {
			l.Group = "connect-" + name
		}
		l.Message = str(ConnectExceptionMessage)
		l.Class = classify(str(ConnectExceptionClass), fallback)
	case dialectStreams:
		orig.Topic = str(StreamsTopic)
		orig.Partition = int32(num(StreamsPartition))
		orig.Offset = num(StreamsOffset)
		origTS = r.Timestamp
		l.Message = str(StreamsMessage)
		exc, _, _ := strings.Cut(str(StreamsException), ":")
		l.Class = classify(strings.TrimSpace(exc), fallback)
	}
	orig.Timestamp = origTS

	// kpar's own headers win over what a dialect implies.
	if v, ok := vals[HeaderClass]; ok && Class(v).Valid() {
		l.Class = Class(v)
	}
	if v, ok := vals[HeaderKparDeliveryCount]; ok {
		l.Attempts = int(decodeNumber(v))
	}
	if v, ok := vals[HeaderOriginalTimestamp]; ok {
		orig.Timestamp = parseTime(v)
	}
	if v, ok := vals[HeaderFirstFailure]; ok {
		l.FirstFailure = parseTime(v)
	}
	if v, ok := vals[HeaderLastFailure]; ok {
		l.LastFailure = parseTime(v)
	} else if !r.Timestamp.IsZero() && !r.Timestamp.Equal(orig.Timestamp) && d != dialectKpar {
		l.LastFailure = r.Timestamp
	}
	return l
}

func lastHeader(hs []kgo.RecordHeader, k string) []byte {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == k {
			return hs[i].Value
		}
	}
	return nil
}

// decodeNumber reads a big-endian 4- or 8-byte integer (Spring), or a
// decimal string (everyone else). Anything else is 0.
func decodeNumber(b []byte) int64 {
	if n, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		return n
	}
	switch len(b) {
	case 4:
		return int64(int32(binary.BigEndian.Uint32(b)))
	case 8:
		return int64(binary.BigEndian.Uint64(b))
	}
	return 0
}

// permanentExceptions are exceptions that Spring's DefaultErrorHandler,
// Connect and Streams treat as not worth retrying (simple class names).
var permanentExceptions = map[string]bool{
	"DeserializationException":          true,
	"SerializationException":            true,
	"MessageConversionException":        true,
	"ConversionException":               true,
	"ConversionFailedException":         true,
	"MethodArgumentResolutionException": true,
	"MethodArgumentNotValidException":   true,
	"NoSuchMethodException":             true,
	"ClassCastException":                true,
	"DataException":                     true,
	"RecordTooLargeException":           true,
	"InvalidRecordException":            true,
	"JsonParseException":                true,
	"JsonMappingException":              true,
	"MismatchedInputException":          true,
	"InvalidFormatException":            true,
	"UnrecognizedPropertyException":     true,
	"NotRetryableException":             true,
}

// classify maps an exception class name to a Class, or fallback when the
// name tells nothing.
func classify(fqcn string, fallback Class) Class {
	if c, ok := strings.CutPrefix(fqcn, springFQCNPrefix); ok && Class(c).Valid() {
		return Class(c)
	}
	simple := fqcn
	if i := strings.LastIndexAny(simple, ".$"); i >= 0 {
		simple = simple[i+1:]
	}
	switch {
	case simple == "":
		return fallback
	case strings.Contains(simple, "Timeout"):
		return ClassTimeout
	case permanentExceptions[simple]:
		return ClassPermanent
	case strings.HasSuffix(simple, "Error"):
		return ClassPanic
	}
	return fallback
}
