package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestByteSizeReadsUnits(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		text string
	}{
		{"1048576", 1 << 20, "1MiB"},
		{"256MiB", 256 << 20, "256MiB"},
		{"256mib", 256 << 20, "256MiB"},
		{"64 MiB", 64 << 20, "64MiB"},
		{"1GiB", 1 << 30, "1GiB"},
		{"100MB", 100e6, "100000000"},
		{"2kb", 2000, "2000"},
		{"512KiB", 512 << 10, "512KiB"},
		{"4096B", 4096, "4KiB"},
	} {
		var b byteSize
		if err := b.Set(tc.in); err != nil || int64(b) != tc.want || b.String() != tc.text {
			t.Errorf("Set(%q) = %d (%s), %v; want %d (%s)", tc.in, int64(b), b, err, tc.want, tc.text)
		}
	}
	for _, in := range []string{"", "lots", "1.5GiB", "-1MiB", "10TiB", "9999999999GiB"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) = %d, want an error", in, int64(b))
		}
	}
}

// --max-buffered-bytes of kpar forward and kpar backfill: a bound too small
// or not a size is one line of usage error naming the flag, exit 2.
func TestMaxBufferedBytesRejectsBadSizes(t *testing.T) {
	commands := map[string]struct {
		run  func(context.Context, []string, io.Writer, io.Writer) int
		args []string
	}{
		"forward":  {cmdForward, []string{"--brokers", "127.0.0.1:9092", "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:8080/in"}},
		"backfill": {cmdBackfill, []string{"--brokers", "127.0.0.1:9092", "--topic", "t", "--from", "0", "--to", "1", "--url", "http://127.0.0.1:8080/in"}},
	}
	for name, cmd := range commands {
		for _, size := range []string{"10KiB", "lots", "0"} {
			t.Run(name+"/"+size, func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				if code := cmd.run(t.Context(), append(cmd.args, "--max-buffered-bytes", size), &stdout, &stderr); code != 2 {
					t.Errorf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
				}
				if msg := stderr.String(); strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "--max-buffered-bytes") {
					t.Errorf("stderr = %q, want one line naming --max-buffered-bytes", msg)
				}
			})
		}
	}
}

// kpar forward's start-up line says the bound it runs with: the default,
// 64MiB, or the flag's (KPAR_MAX_BUFFERED_BYTES alike).
func TestForwardLogsItsBufferedBytesBound(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there: the forwarder logs its start, then waits
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"default", nil, "max_buffered_bytes=64MiB"},
		{"flag", []string{"--max-buffered-bytes", "256MiB"}, "max_buffered_bytes=256MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			w := newWatchWriter()
			done := make(chan int, 1)
			go func() {
				done <- cmdForward(ctx, append([]string{"--brokers", addr, "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:1/"}, tc.extra...), io.Discard, w)
			}()
			if !w.wait(t.Context(), "kpar forward starting", nil) {
				t.Fatalf("no startup line; stderr:\n%s", w)
			}
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("cmdForward did not return after cancel; stderr:\n%s", w)
			}
			if !strings.Contains(w.String(), tc.want) {
				t.Errorf("the startup line does not say %s:\n%s", tc.want, w)
			}
		})
	}
}
