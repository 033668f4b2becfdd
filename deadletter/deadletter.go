package deadletter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Class is why a record was dead-lettered.
type Class string

const (
	// ClassPermanent: the handler said retrying cannot help
	// (kpar.Permanent), or a foreign framework failed with an exception
	// that is not retried (deserialization, conversion, ...).
	ClassPermanent Class = "permanent"
	// ClassExhausted: every allowed attempt failed.
	ClassExhausted Class = "exhausted"
	// ClassTimeout: the last attempt ran past its deadline.
	ClassTimeout Class = "timeout"
	// ClassPanic: the handler panicked; Message carries the panic and its
	// stack. Foreign records whose exception is a Java Error (an
	// ...Error class, such as StackOverflowError) decode to this class too.
	ClassPanic Class = "panic"
	// ClassUnknown is only produced by readers, for foreign dead letters
	// whose exception does not tell (see FromRecord) and for records that
	// carry no dead-letter headers at all. kpar never writes it.
	ClassUnknown Class = "unknown"
)

// Valid reports whether c is one of the classes above.
func (c Class) Valid() bool {
	switch c {
	case ClassPermanent, ClassExhausted, ClassTimeout, ClassPanic, ClassUnknown:
		return true
	}
	return false
}

// Letter is a record that kpar gave up on, with why and when.
type Letter struct {
	// Record is the original: Topic, Partition, Offset, Key, Value,
	// Headers and Timestamp are kept byte-for-byte by every sink and
	// source. Readers return the original's headers only: the dead-letter
	// headers a sink added are stripped.
	Record *kgo.Record

	Group        string    // consumer group that failed to handle Record
	Class        Class     // why it was dead-lettered
	Message      string    // the last error's text
	Attempts     int       // delivery count; 0 when a foreign format does not say
	FirstFailure time.Time // zero when unknown
	LastFailure  time.Time // zero when unknown
}

// ID is the identity of a dead letter's original record:
// "topic/partition/offset". Several consumer groups may dead-letter the
// same record, so a letter is one (Group, ID) pair: sinks are idempotent
// and readers deduplicate per pair, and Replay sends each ID once per run,
// with the ID as the value of HeaderReplayedFrom.
func (l Letter) ID() string {
	if l.Record == nil {
		return ""
	}
	return fmt.Sprintf("%s/%d/%d", l.Record.Topic, l.Record.Partition, l.Record.Offset)
}

// Truncated reports whether a KafkaSink had to leave part of the record
// out of this letter because its topic refused it as too large: its
// headers include HeaderValueTruncated, HeaderKeyTruncated or
// HeaderHeadersDropped. The original is then only in the source topic,
// while its retention keeps it.
func (l Letter) Truncated() bool {
	if l.Record == nil {
		return false
	}
	for _, h := range l.Record.Headers {
		switch h.Key {
		case HeaderValueTruncated, HeaderKeyTruncated, HeaderHeadersDropped:
			return true
		}
	}
	return false
}

// Sink stores dead letters durably.
//
// Write returns nil only once every letter is durable; on error the caller
// retries the whole batch later. Write is therefore idempotent per letter
// (group and original topic, partition and offset) where the medium allows
// it (pgsink); where it does not (Kafka, files), a retried batch can store a
// letter twice and the readers of this package drop the later copies.
// Write must be safe for concurrent use.
type Sink interface {
	Write(ctx context.Context, letters []Letter) error
}

// Source reads dead letters back, for inspection and replay.
//
// Read calls fn once per dead letter, in the medium's order (append order
// for files and tables, offset order within each partition for Kafka),
// dropping later copies of a letter already seen (same group and original
// topic, partition and offset); the letters of several groups for one
// record are all passed on. It stops at the first error fn returns and
// returns it. A Source holds no connection between Read calls, and Read may
// be called again to read the same letters.
type Source interface {
	Read(ctx context.Context, fn func(Letter) error) error
}

// ErrClosed is returned by Write on a FileSink (or a pgsink.Sink) after
// Close.
var ErrClosed = errors.New("deadletter: sink closed")

// letterKey identifies a letter: the group that gave up on a record, and
// the record. Readers dedupe on it.
type letterKey struct {
	group     string
	topic     string
	partition int32
	offset    int64
}

func keyOf(l Letter) letterKey {
	if l.Record == nil {
		return letterKey{group: l.Group}
	}
	return letterKey{l.Group, l.Record.Topic, l.Record.Partition, l.Record.Offset}
}

// dedupe wraps fn so that letters already passed on are dropped.
func dedupe(fn func(Letter) error) func(Letter) error {
	seen := make(map[letterKey]struct{})
	return func(l Letter) error {
		k := keyOf(l)
		if _, ok := seen[k]; ok {
			return nil
		}
		seen[k] = struct{}{}
		return fn(l)
	}
}
