package deadletter

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestPostgresSinkUnreachable: with the server down, the sink can still be
// built (the table is created on the first successful Write), and Write
// fails promptly, within its context.
func TestPostgresSinkUnreachable(t *testing.T) {
	ctx := testCtx(t)
	dsn := "postgres://kpar@" + closedPort(t) + "/postgres?sslmode=disable&connect_timeout=5"
	s, err := OpenPostgresSink(ctx, dsn)
	if err != nil {
		t.Fatalf("OpenPostgresSink with the server down: %v", err)
	}
	defer s.Close()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	err = s.Write(wctx, sampleLetters("orders"))
	if err == nil {
		t.Fatal("Write succeeded with the server down")
	}
	if d := time.Since(start); d > 3*time.Second+500*time.Millisecond {
		t.Fatalf("Write took %v with a 3s deadline", d)
	}
	t.Logf("Write failed after %v: %v", time.Since(start).Round(time.Millisecond), err)

	src, err := OpenSource(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Read(wctx, func(DeadLetter) error { return nil }); err == nil {
		t.Fatal("Read succeeded with the server down")
	}
}

func TestPostgresSinkRejectsBadTableNames(t *testing.T) {
	ctx := testCtx(t)
	dsn := "postgres://kpar@" + closedPort(t) + "/postgres?sslmode=disable"
	for _, name := range []string{"", "1abc", "a-b", `x"; DROP TABLE y; --`, "a.b.c", strings.Repeat("a", 64)} {
		if s, err := OpenPostgresSink(ctx, dsn, Table(name)); err == nil {
			s.Close()
			t.Errorf("Table(%q) accepted", name)
		}
		if _, err := OpenSource(ctx, withTable(dsn, name)); err == nil && name != "" {
			t.Errorf("source table %q accepted", name)
		}
	}
	for _, name := range []string{"dead", "_x1", "dlq.orders", strings.Repeat("a", 63)} {
		s, err := OpenPostgresSink(ctx, dsn, Table(name))
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
	s, err := OpenPostgresSink(ctx, dsn, Table(uniqueTable(t, dsn)))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
	if err := s.Write(ctx, sampleLetters("orders")); err == nil {
		t.Fatal("Write after Close succeeded")
	}
}
