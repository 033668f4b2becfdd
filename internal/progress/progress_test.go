package progress

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func sample() *State {
	return &State{
		Range: Range{Topic: "orders", Partitions: []int32{0, 3}, From: "5000", To: "2026-01-02T03:04:05Z"},
		Slices: []Slice{
			{Partition: 0, From: 5000, To: 7500, Done: 6000},
			{Partition: 0, From: 7500, To: 10000, Done: 10000},
			{Partition: 3, From: 10, To: 20, Done: 10},
		},
	}
}

func TestProgressSaveLoadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.json")
	if s, err := Load(path); s != nil || err != nil {
		t.Fatalf("Load of a missing file = %v, %v; want nil, nil", s, err)
	}
	want := sample()
	for range 2 { // the second Save replaces the first
		if err := Save(path, want); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Load = %+v; want %+v", got, want)
	}
	if n := got.Remaining(); n != 1500+10 {
		t.Errorf("Remaining = %d; want 1510", n)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after Save; want only the file (no temporary left)", len(entries))
	}
}

func TestProgressFileStaysSmall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.json")
	s := &State{Range: Range{Topic: "t", From: "0", To: "9000000000000"}}
	for i := range int64(8) {
		s.Slices = append(s.Slices, Slice{Partition: 0, From: i * 1e12, To: (i + 1) * 1e12, Done: i*1e12 + 123456789})
	}
	if err := Save(path, s); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	if fi.Size() > 1024 {
		t.Errorf("8 slices over 8e12 offsets take %d bytes; want under 1 KiB", fi.Size())
	}
}

func TestProgressCheckRefusesAnotherRange(t *testing.T) {
	s := sample()
	if err := s.Check("p.json", s.Range); err != nil {
		t.Fatalf("Check of its own range: %v", err)
	}
	for _, r := range []Range{
		{Topic: "other", Partitions: []int32{0, 3}, From: "5000", To: "2026-01-02T03:04:05Z"},
		{Topic: "orders", From: "5000", To: "2026-01-02T03:04:05Z"},
		{Topic: "orders", Partitions: []int32{0, 3}, From: "5001", To: "2026-01-02T03:04:05Z"},
		{Topic: "orders", Partitions: []int32{0, 3}, From: "5000", To: "15000"},
	} {
		err := s.Check("p.json", r)
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "p.json") {
			t.Errorf("Check(%v) = %v; want ErrMismatch naming the file", r, err)
		}
	}
}

func TestProgressLoadRejectsForeignFiles(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"not json":      "hello",
		"unknown field": `{"version":1,"range":{"topic":"t","from":"0","to":"1"},"slices":[],"x":1}`,
		"version":       `{"version":7,"range":{"topic":"t","from":"0","to":"1"},"slices":[]}`,
		"done past to":  `{"version":1,"range":{"topic":"t","from":"0","to":"9"},"slices":[{"partition":0,"from":0,"to":9,"done":10}]}`,
		"overlap":       `{"version":1,"range":{"topic":"t","from":"0","to":"9"},"slices":[{"partition":0,"from":0,"to":5,"done":0},{"partition":0,"from":4,"to":9,"done":4}]}`,
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		os.WriteFile(path, []byte(content), 0o644)
		if s, err := Load(path); err == nil {
			t.Errorf("%s: Load = %+v, nil; want an error", name, s)
		}
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o644)
	if s, err := Load(empty); s != nil || err != nil {
		t.Errorf("Load of an empty file = %v, %v; want nil, nil (no progress yet)", s, err)
	}
}
