package pgsink

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kpar/kpar/deadletter"
)

// TestPostgresSinkUnreachable: with the server down, New can still build
// the sink on a pool (the table is created on the first successful Write),
// and Write fails promptly, within its context.
func TestPostgresSinkUnreachable(t *testing.T) {
	ctx := testCtx(t)
	dsn := "postgres://kpar@" + closedPort(t) + "/postgres?sslmode=disable&connect_timeout=5"
	s, err := New(ctx, lazyPool(t, dsn))
	if err != nil {
		t.Fatalf("New with the server down: %v", err)
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

// TestOpenChecksTheServer: Open fails at once, naming the host and what to
// check, when nothing listens, and within the connect timeout when a
// listener never answers.
func TestOpenChecksTheServer(t *testing.T) {
	ctx := testCtx(t)
	refused := closedPort(t)
	start := time.Now()
	_, err := Open(ctx, "postgres://kpar@"+refused+"/postgres?sslmode=disable")
	if err == nil {
		t.Fatal("Open succeeded with nothing listening")
	}
	if msg := err.Error(); !strings.Contains(msg, "cannot reach PostgreSQL at "+refused) || !strings.Contains(msg, "check that the server is running") {
		t.Errorf("Open error = %q, want it to name %s and what to check", msg, refused)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Open took %v to see a refused connection", d)
	}

	// A listener that accepts and never answers: the connect timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	start = time.Now()
	_, err = Open(ctx, "postgres://kpar@"+ln.Addr().String()+"/postgres?sslmode=disable&connect_timeout=1")
	if err == nil {
		t.Fatal("Open succeeded against a silent listener")
	}
	if d := time.Since(start); d < time.Second || d > 3*time.Second {
		t.Errorf("Open gave up after %v with connect_timeout=1", d)
	}
	if !strings.Contains(err.Error(), "cannot reach PostgreSQL at "+ln.Addr().String()) {
		t.Errorf("Open error = %q", err)
	}
	t.Logf("silent listener: %v after %v", err, time.Since(start).Round(time.Millisecond))
}

func TestPostgresSinkRejectsBadTableNames(t *testing.T) {
	ctx := testCtx(t)
	dsn := "postgres://kpar@" + closedPort(t) + "/postgres?sslmode=disable"
	pool := lazyPool(t, dsn)
	for _, name := range []string{"", "1abc", "a-b", `x"; DROP TABLE y; --`, "a.b.c", strings.Repeat("a", 64)} {
		if _, err := New(ctx, pool, Table(name)); err == nil {
			t.Errorf("Table(%q) accepted", name)
		}
		if _, err := Open(ctx, dsn, Table(name)); err == nil || strings.Contains(err.Error(), "cannot reach") {
			t.Errorf("Open with Table(%q): %v, want the name rejected before connecting", name, err)
		}
		if _, err := OpenSource(withTable(dsn, name)); err == nil && name != "" {
			t.Errorf("source table %q accepted", name)
		}
	}
	for _, name := range []string{"dead", "_x1", "dlq.orders", strings.Repeat("a", 63)} {
		if _, err := New(ctx, pool, Table(name)); err != nil {
			t.Errorf("Table(%q) rejected: %v", name, err)
		}
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
	s, dsn, table := openTestSink(ctx, t)
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

// openTestSink opens a sink on a table of the test's own, closed after
// the test.
func openTestSink(ctx context.Context, t *testing.T) (s *Sink, dsn, table string) {
	t.Helper()
	dsn = postgresDSN(t)
	table = uniqueTable(t, dsn)
	s, err := Open(ctx, dsn, Table(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, dsn, table
}

// bytesEqual tells nil from empty.
func bytesEqual(a, b []byte) bool { return (a == nil) == (b == nil) && string(a) == string(b) }

// TestSinkKeepsEveryGroupsLetter: two groups sharing a table dead-letter
// the same records; each group's letters are stored once.
func TestSinkKeepsEveryGroupsLetter(t *testing.T) {
	ctx := testCtx(t)
	s, dsn, table := openTestSink(ctx, t)
	billing := sampleLetters()
	var audit []deadletter.Letter
	for _, l := range billing {
		l.Group = "audit"
		audit = append(audit, l)
	}
	for _, b := range [][]deadletter.Letter{billing, audit, billing, audit[1:]} {
		if err := s.Write(ctx, b); err != nil {
			t.Fatalf("Write: %v", err)
		}
	}
	src, err := OpenSource(withTable(dsn, table))
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	if err := src.Read(ctx, func(l deadletter.Letter) error { count[l.Group+" "+l.ID()]++; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(count) != 2*len(billing) {
		t.Errorf("read letters %v, want each of %d records once per group", count, len(billing))
	}
	for k, n := range count {
		if n != 1 {
			t.Errorf("letter %s read %d times", k, n)
		}
	}
}
