package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpar/kpar/internal/testkit"
)

// TestForwardChecksTheDeadLetterSinkAtStart: a dead-letter sink that
// cannot be used stops kpar forward at start with exit 1 and a message
// naming it, whether it is a file in a missing directory or a PostgreSQL
// server nothing listens for (issue 28: the postgres:// sink was not
// checked, and every dead letter would have failed later).
func TestForwardChecksTheDeadLetterSinkAtStart(t *testing.T) {
	pg := testkit.ClosedPort(t)
	for _, tc := range []struct {
		name, sink string
		want       []string
	}{
		{"file", "file://" + filepath.Join(t.TempDir(), "missing", "dlq.jsonl"), []string{"no such file or directory"}},
		{"postgres", "postgres://kpar@" + pg + "/kpar?sslmode=disable",
			[]string{"cannot reach PostgreSQL at " + pg, "check that the server is running"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out, errb bytes.Buffer
			start := time.Now()
			code := cmdForward(ctx, []string{"--brokers", testkit.ClosedPort(t), "--group", "g", "--topic", "t",
				"--url", "http://127.0.0.1:1/", "--dead-letters", tc.sink}, &out, &errb)
			took := time.Since(start)
			if code != 1 {
				t.Fatalf("exit %d, want 1; stderr:\n%s", code, errb.String())
			}
			log := errb.String()
			if !strings.Contains(log, "opening the dead-letter sink") {
				t.Errorf("stderr does not say the sink failed:\n%s", log)
			}
			for _, w := range tc.want {
				if !strings.Contains(log, w) {
					t.Errorf("stderr lacks %q:\n%s", w, log)
				}
			}
			if took > 5*time.Second {
				t.Errorf("gave up after %v, want within a few seconds", took)
			}
		})
	}
}
