// Package progress keeps the progress of a backfill in a small file, so that
// a backfill stopped or killed half-way resumes where it was.
//
// A backfill reads a fixed range of offsets, cut into slices (several per
// partition, one reader each). For each slice the file records Done: every
// record of the slice below Done is finished (handled, or acknowledged by
// the dead-letter sink). Records finished above the first unfinished one are
// not recorded: a resumed run handles them again. The file therefore holds
// one line of numbers per slice however large the range, and it names the
// range it belongs to, so that a run over another range refuses it instead
// of skipping records it never handled.
//
// Save replaces the file atomically and durably: it writes a temporary file
// in the same directory, fsyncs it, renames it over the old one and fsyncs
// the directory. After a crash the file is the old version or the new one,
// never a mix. Load reads it back; there are no goroutines and no locks,
// and one file must serve one run at a time.
package progress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// Version is the format version Save writes and Load accepts.
const Version = 1

// maxSlices bounds the slices of a file Load accepts: a larger one is not
// ours (the backfill makes readers × partitions slices).
const maxSlices = 1 << 20

// Range names what a file's progress is about, as the user asked for it:
// the same Range means the same records, so its progress may be reused.
type Range struct {
	Topic string `json:"topic"`
	// Partitions as asked, sorted; empty for every partition.
	Partitions []int32 `json:"partitions,omitempty"`
	// From and To as given: a decimal offset or an RFC 3339 time.
	From string `json:"from"`
	To   string `json:"to"`
}

func (r Range) String() string {
	ps := "every partition"
	if len(r.Partitions) > 0 {
		ps = fmt.Sprintf("partitions %v", r.Partitions)
	}
	return fmt.Sprintf("topic %q, %s, from %s to %s", r.Topic, ps, r.From, r.To)
}

// Equal reports whether r and o name the same records.
func (r Range) Equal(o Range) bool {
	return r.Topic == o.Topic && slices.Equal(r.Partitions, o.Partitions) && r.From == o.From && r.To == o.To
}

// Slice is one reader's part of a partition: offsets [From, To), of which
// [From, Done) are finished.
type Slice struct {
	Partition int32 `json:"partition"`
	From      int64 `json:"from"`
	To        int64 `json:"to"`
	Done      int64 `json:"done"`
}

// State is the content of a progress file.
type State struct {
	Version int     `json:"version"`
	Range   Range   `json:"range"`
	Slices  []Slice `json:"slices"`
}

// Remaining counts the offsets of every slice not finished yet.
func (s *State) Remaining() int64 {
	var n int64
	for _, sl := range s.Slices {
		n += sl.To - sl.Done
	}
	return n
}

// ErrMismatch is wrapped by Check when a file belongs to another range.
var ErrMismatch = errors.New("progress file is for another range")

// Check returns an error wrapping ErrMismatch unless s is about r.
func (s *State) Check(path string, r Range) error {
	if s.Range.Equal(r) {
		return nil
	}
	return fmt.Errorf("%w: %s holds the progress of %s, not of %s; use another progress file for this range, or delete it to start over",
		ErrMismatch, path, s.Range, r)
}

// validate checks that s could have been written by Save.
func (s *State) validate() error {
	if s.Version != Version {
		return fmt.Errorf("format version %d, want %d", s.Version, Version)
	}
	if s.Range.Topic == "" {
		return errors.New("no topic")
	}
	if len(s.Slices) > maxSlices {
		return fmt.Errorf("%d slices, more than %d", len(s.Slices), maxSlices)
	}
	for i, sl := range s.Slices {
		if sl.Partition < 0 || sl.From < 0 || sl.From >= sl.To || sl.Done < sl.From || sl.Done > sl.To {
			return fmt.Errorf("slice %d (%+v) is inconsistent: want 0 <= from <= done <= to, from < to", i, sl)
		}
		if i > 0 {
			prev := s.Slices[i-1]
			if prev.Partition > sl.Partition || (prev.Partition == sl.Partition && prev.To > sl.From) {
				return fmt.Errorf("slices %d and %d overlap or are out of order", i-1, i)
			}
		}
	}
	return nil
}

// Load reads the progress file at path. It returns nil and no error when
// the file does not exist or is empty: there is no progress yet, and
// starting over can only repeat records, never skip one. A file that is not
// a progress file is an error, not a fresh start.
func Load(path string) (*State, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(bytes.TrimSpace(b)) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("progress: %w", err)
	}
	var s State
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("progress: %s is not a kpar progress file: %v", path, err)
	}
	if err := s.validate(); err != nil {
		return nil, fmt.Errorf("progress: %s is not a usable kpar progress file: %v", path, err)
	}
	return &s, nil
}

// Save writes s to path atomically and durably (see the package doc).
func Save(path string, s *State) error {
	s.Version = Version
	if err := s.validate(); err != nil {
		return fmt.Errorf("progress: refusing to save: %v", err)
	}
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("progress: %w", err)
	}
	b = append(b, '\n')
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return fmt.Errorf("progress: %w", err)
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("progress: saving %s: %w", path, err)
	}
	// The rename is durable only once the directory entry is.
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("progress: saving %s: syncing its directory: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
