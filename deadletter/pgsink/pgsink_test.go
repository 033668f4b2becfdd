package pgsink

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kpar/kpar/deadletter"
)

// TestPostgresSinkUnreachable: with the server down, the sink can still be
// built (the table is created on the first successful Write), and Write
// fails promptly, within its context.
func TestPostgresSinkUnreachable(t *testing.T) {
	ctx := testCtx(t)
	dsn := "postgres://kpar@" + closedPort(t) + "/postgres?sslmode=disable&connect_timeout=5"
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open with the server down: %v", err)
	}
	defer s.Close()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	err = s.Write(wctx, sampleLetters())
	if err == nil {
		t.Fatal("Write succeeded with the server down")
	}
	if d := time.Since(start); d > 3*time.Second+500*time.Millisecond {
		t.Fatalf("Write took %v with a 3s deadline", d)
	}
	t.Logf("Write failed after %v: %v", time.Since(start).Round(time.Millisecond), err)

	src, err := OpenSource(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Read(wctx, func(deadletter.Letter) error { return nil }); err == nil {
		t.Fatal("Read succeeded with the server down")
	}
}

func TestPostgresSinkRejectsBadTableNames(t *testing.T) {
	ctx := testCtx(t)
	dsn := "postgres://kpar@" + closedPort(t) + "/postgres?sslmode=disable"
	for _, name := range []string{"", "1abc", "a-b", `x"; DROP TABLE y; --`, "a.b.c", strings.Repeat("a", 64)} {
		if s, err := Open(ctx, dsn, Table(name)); err == nil {
			s.Close()
			t.Errorf("Table(%q) accepted", name)
		}
		if _, err := OpenSource(withTable(dsn, name)); err == nil && name != "" {
			t.Errorf("source table %q accepted", name)
		}
	}
	for _, name := range []string{"dead", "_x1", "dlq.orders", strings.Repeat("a", 63)} {
		s, err := Open(ctx, dsn, Table(name))
		if err != nil {
			t.Errorf("Table(%q) rejected: %v", name, err)
			continue
		}
		s.Close()
	}
}

// TestPostgresSinkWriteAfterClose: Close ends the sink, and a second
// Close is harmless.
func TestPostgresSinkWriteAfterClose(t *testing.T) {
	ctx := testCtx(t)
	dsn := postgresDSN(t)
	s, err := Open(ctx, dsn, Table(uniqueTable(t, dsn)))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
	if err := s.Write(ctx, sampleLetters()); err == nil {
		t.Fatal("Write after Close succeeded")
	}
}

// TestSinkRoundTrip: what Write stores, OpenSource reads back exactly, and
// writing a batch again (a retry after a partial failure) stores nothing
// twice: the first copy of a record stays.
func TestSinkRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	dsn := postgresDSN(t)
	table := uniqueTable(t, dsn)
	s, err := Open(ctx, dsn, Table(table))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := sampleLetters()
	later := want[0]
	later.Message = "a later failure"
	for _, b := range [][]deadletter.Letter{want, want[1:], {later}} {
		if err := s.Write(ctx, b); err != nil {
			t.Fatalf("Write: %v", err)
		}
	}
	src, err := OpenSource(withTable(dsn, table))
	if err != nil {
		t.Fatal(err)
	}
	var got []deadletter.Letter
	if err := src.Read(ctx, func(l deadletter.Letter) error { got = append(got, l); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d letters, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		same := g.ID() == w.ID() && g.Message == w.Message && g.Class == w.Class && g.Attempts == w.Attempts &&
			bytesEqual(g.Record.Key, w.Record.Key) && bytesEqual(g.Record.Value, w.Record.Value) &&
			g.Record.Timestamp.Equal(w.Record.Timestamp) && g.FirstFailure.Equal(w.FirstFailure) &&
			len(g.Record.Headers) == len(w.Record.Headers)
		for j := range w.Record.Headers {
			same = same && g.Record.Headers[j].Key == w.Record.Headers[j].Key && bytesEqual(g.Record.Headers[j].Value, w.Record.Headers[j].Value)
		}
		if !same {
			t.Errorf("letter %d = %+v %+v, want %+v %+v", i, g, g.Record, w, w.Record)
		}
	}
}

// bytesEqual tells nil from empty.
func bytesEqual(a, b []byte) bool { return (a == nil) == (b == nil) && string(a) == string(b) }
