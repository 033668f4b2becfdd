package deadletter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// FileSink appends dead letters to a JSON Lines file, one object per letter:
//
//	{"topic":"orders","partition":3,"offset":1234,
//	 "key":"base64"|null,"value":"base64"|null,
//	 "headers":[{"key":"trace","value":"base64"|null}],
//	 "timestamp":"RFC 3339",
//	 "group":"billing","class":"exhausted","message":"...","attempts":5,
//	 "first_failure":"RFC 3339","last_failure":"RFC 3339"}
//
// Times are RFC 3339 with nanoseconds; zero times are left out. A header key
// that is not valid UTF-8 is written as "key_base64" instead of "key".
// `kpar dlq list --json` writes the same format.
//
// Write appends the whole batch with one write call and fsyncs before it
// returns. A failed write is cut off again, and NewFileSink cuts off a torn
// last line left by a crash (it was never acknowledged), so the file always
// holds whole lines. A crash after the fsync but before the caller recorded
// success makes the caller write the batch again: the file then holds
// duplicates, which readers drop by (topic, partition, offset), keeping the
// first. Use one FileSink per file, in one process: it writes at the end it
// knows of, and it is safe for concurrent use only within itself.
type FileSink struct {
	mu     sync.Mutex // guards f and size; one Write at a time
	f      *os.File
	size   int64 // bytes of whole lines
	closed bool
}

var _ Sink = (*FileSink)(nil)

// NewFileSink opens path for appending, creating it (mode 0644) if missing.
func NewFileSink(path string) (*FileSink, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("deadletter: %w", err)
	}
	size, err := wholeLines(f)
	if err == nil {
		err = f.Truncate(size)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("deadletter: %s: %w", path, err)
	}
	return &FileSink{f: f, size: size}, nil
}

// wholeLines returns the length of f up to and including its last newline.
func wholeLines(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := fi.Size()
	buf := make([]byte, 4096)
	for end > 0 {
		n := int64(len(buf))
		if end < n {
			n = end
		}
		if _, err := f.ReadAt(buf[:n], end-n); err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return end - n + int64(i) + 1, nil
		}
		end -= n
	}
	return 0, nil
}

// Write implements Sink.
func (s *FileSink) Write(ctx context.Context, letters []Letter) error {
	if len(letters) == 0 {
		return nil
	}
	var buf bytes.Buffer
	for _, l := range letters {
		if l.Record == nil {
			return errors.New("deadletter: dead letter without a record")
		}
		line, err := json.Marshal(toJSON(l))
		if err != nil {
			return fmt.Errorf("deadletter: encoding %s: %w", l.ID(), err)
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	_, err := s.f.WriteAt(buf.Bytes(), s.size)
	if err == nil {
		err = s.f.Sync()
	}
	if err != nil {
		// Cut a partial batch off again so the next Write starts on a
		// line boundary.
		if terr := s.f.Truncate(s.size); terr != nil {
			err = errors.Join(err, terr)
		}
		return fmt.Errorf("deadletter: writing %s: %w", s.f.Name(), err)
	}
	s.size += int64(buf.Len())
	return nil
}

// Close closes the file. Writes after Close return ErrClosed.
func (s *FileSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.f.Close()
}

// jsonLetter is one line of a FileSink file.
type jsonLetter struct {
	Topic        string       `json:"topic"`
	Partition    int32        `json:"partition"`
	Offset       int64        `json:"offset"`
	Key          []byte       `json:"key"`
	Value        []byte       `json:"value"`
	Headers      []jsonHeader `json:"headers"`
	Timestamp    *time.Time   `json:"timestamp,omitempty"`
	Group        string       `json:"group"`
	Class        Class        `json:"class"`
	Message      string       `json:"message"`
	Attempts     int          `json:"attempts"`
	FirstFailure *time.Time   `json:"first_failure,omitempty"`
	LastFailure  *time.Time   `json:"last_failure,omitempty"`
}

type jsonHeader struct {
	Key       string `json:"key,omitempty"`
	KeyBase64 []byte `json:"key_base64,omitempty"`
	Value     []byte `json:"value"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func toJSON(l Letter) jsonLetter {
	r := l.Record
	j := jsonLetter{
		Topic:        r.Topic,
		Partition:    r.Partition,
		Offset:       r.Offset,
		Key:          r.Key,
		Value:        r.Value,
		Headers:      make([]jsonHeader, 0, len(r.Headers)),
		Timestamp:    timePtr(r.Timestamp),
		Group:        l.Group,
		Class:        l.Class,
		Message:      l.Message,
		Attempts:     l.Attempts,
		FirstFailure: timePtr(l.FirstFailure),
		LastFailure:  timePtr(l.LastFailure),
	}
	for _, h := range r.Headers {
		jh := jsonHeader{Key: h.Key, Value: h.Value}
		if !utf8.ValidString(h.Key) {
			jh = jsonHeader{KeyBase64: []byte(h.Key), Value: h.Value}
		}
		j.Headers = append(j.Headers, jh)
	}
	return j
}

func (j jsonLetter) letter() Letter {
	r := &kgo.Record{
		Topic:     j.Topic,
		Partition: j.Partition,
		Offset:    j.Offset,
		Key:       j.Key,
		Value:     j.Value,
	}
	if j.Timestamp != nil {
		r.Timestamp = *j.Timestamp
	}
	for _, h := range j.Headers {
		k := h.Key
		if h.KeyBase64 != nil {
			k = string(h.KeyBase64)
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: h.Value})
	}
	l := Letter{Record: r, Group: j.Group, Class: j.Class, Message: j.Message, Attempts: j.Attempts}
	if j.FirstFailure != nil {
		l.FirstFailure = *j.FirstFailure
	}
	if j.LastFailure != nil {
		l.LastFailure = *j.LastFailure
	}
	return l
}

// MarshalJSONLine encodes l as one line of the FileSink format, without the
// trailing newline.
func MarshalJSONLine(l Letter) ([]byte, error) {
	if l.Record == nil {
		return nil, errors.New("deadletter: dead letter without a record")
	}
	return json.Marshal(toJSON(l))
}

// fileSource reads a FileSink file.
type fileSource struct{ path string }

func (s fileSource) Read(ctx context.Context, fn func(Letter) error) error {
	f, err := os.Open(s.path)
	if err != nil {
		return fmt.Errorf("deadletter: %w", err)
	}
	defer f.Close()
	fn = dedupe(fn)
	br := bufio.NewReaderSize(f, 64<<10)
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, err := br.ReadBytes('\n')
		if err == io.EOF && len(line) > 0 {
			// A torn last line (crash mid-write): never acknowledged.
			return nil
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("deadletter: %s: %w", s.path, err)
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var j jsonLetter
		if err := json.Unmarshal(line, &j); err != nil {
			return fmt.Errorf("deadletter: %s line %d: %w", s.path, n, err)
		}
		if err := fn(j.letter()); err != nil {
			return err
		}
	}
}
