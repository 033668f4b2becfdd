package deadletter

import (
	"bytes"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestCutGoesThroughTheStagesInTurn: Cut, for a caller producing dead
// letters itself, leaves out the value first, then the key and the large
// headers, then every header and most of the message; a stage that would
// cut nothing more is passed over, and past the last it says to raise the
// topic's max.message.bytes.
func TestCutGoesThroughTheStagesInTurn(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1")) // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s := NewKafkaSink(cl)
	l := Letter{
		Record: &kgo.Record{Topic: "t", Key: []byte("key"), Value: bytes.Repeat([]byte("v"), 100),
			Headers: []kgo.RecordHeader{{Key: "small", Value: []byte("x")}}},
		Group: "g", Class: ClassPermanent, Message: strings.Repeat("m", 2000),
	}
	rec, stage, err := s.Cut(t.Context(), l, 1)
	if err != nil || stage != 1 || rec.Value != nil || string(rec.Key) != "key" {
		t.Fatalf("stage 1: %v stage %d key %q value %d bytes, want the value left out", err, stage, rec.Key, len(rec.Value))
	}
	rec, stage, err = s.Cut(t.Context(), l, 2)
	if err != nil || stage != 2 || rec.Key != nil || FromRecord(rec).Record.Headers[0].Key != "small" {
		t.Fatalf("stage 2: %v stage %d, want the key left out and the small header kept", err, stage)
	}
	rec, stage, err = s.Cut(t.Context(), l, 3)
	if err != nil || stage != 3 || !strings.Contains(FromRecord(rec).Message, "cut from") {
		t.Fatalf("stage 3: %v stage %d, want the message cut", err, stage)
	}
	if _, _, err := s.Cut(t.Context(), l, 4); err == nil || !strings.Contains(err.Error(), "max.message.bytes") {
		t.Fatalf("past the last stage: %v, want advice to raise max.message.bytes", err)
	}
	bare := Letter{Record: &kgo.Record{Topic: "t", Value: []byte("v")}, Group: "g", Class: ClassPermanent, Message: "short"}
	if _, stage, err := s.Cut(t.Context(), bare, 2); err == nil {
		t.Fatalf("a letter with nothing left to cut past its value came back at stage %d", stage)
	}
}
