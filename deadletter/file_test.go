package deadletter

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileSinkCutsTornTail: a crash mid-write leaves a partial last line;
// it was never acknowledged, readers ignore it, and the next sink on the
// file cuts it off before appending.
func TestFileSinkCutsTornTail(t *testing.T) {
	ctx := testCtx(t)
	path := filepath.Join(t.TempDir(), "dlq.jsonl")
	letters := sampleLetters("orders")
	s, err := NewFileSink(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, letters[:2]); err != nil {
		t.Fatal(err)
	}
	s.Close()

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"topic":"orders","partition":9,"off`)
	f.Close()

	src, err := OpenSource(ctx, "file://"+path)
	if err != nil {
		t.Fatal(err)
	}
	checkSameLetters(t, letters[:2], readAll(t, ctx, src))

	s, err = NewFileSink(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(ctx, letters[2:]); err != nil {
		t.Fatal(err)
	}
	checkSameLetters(t, letters, readAll(t, ctx, src))
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), `"off`+"\n") || strings.Count(string(b), "\n") != len(letters) {
		t.Fatalf("file holds a torn line or the wrong line count:\n%s", b)
	}
}

func TestFileSourceRejectsCorruptLine(t *testing.T) {
	ctx := testCtx(t)
	path := filepath.Join(t.TempDir(), "dlq.jsonl")
	s, err := NewFileSink(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(ctx, sampleLetters("orders")[:1]); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString("not json\n")
	f.Close()
	src, _ := OpenSource(ctx, "file://"+path)
	err = src.Read(ctx, func(Letter) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("Read = %v, want an error naming line 2", err)
	}
}

func TestFileSinkWriteAfterClose(t *testing.T) {
	s, err := NewFileSink(filepath.Join(t.TempDir(), "dlq.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := s.Write(testCtx(t), sampleLetters("orders")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close = %v, want ErrClosed", err)
	}
}

// TestFileSinkFormat pins the JSON field names of one line.
func TestFileSinkFormat(t *testing.T) {
	b, err := MarshalJSONLine(sampleLetters("orders")[1])
	if err != nil {
		t.Fatal(err)
	}
	want := `{"topic":"orders","partition":0,"offset":11,"key":null,"value":null,"headers":[],` +
		`"timestamp":"2024-05-06T07:08:20.123Z","group":"billing","class":"permanent","message":"bad payload",` +
		`"attempts":1,"last_failure":"2024-05-06T08:00:05.999Z"}`
	if string(b) != want {
		t.Fatalf("line\n got %s\nwant %s", b, want)
	}
}
