package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// Stamped by scripts/image.sh, the version and revision are what kpar
// version prints (and what the image's labels say); unstamped, they come
// from the build info, which a workspace build leaves as "(devel)" with no
// revision.
func TestVersionPrintsTheStampedVersionAndRevision(t *testing.T) {
	for _, tc := range []struct {
		name, version, revision string
		want                    string
	}{
		{"stamped", "v0.2.0", "0123abc+dirty", "kpar v0.2.0\nrevision: 0123abc+dirty\ngo: " + runtime.Version() + "\n"},
		{"from the build info", "", "", "kpar (devel)\nrevision: unknown\ngo: " + runtime.Version() + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(v, r string) { version, revision = v, r }(version, revision)
			version, revision = tc.version, tc.revision
			var stdout, stderr bytes.Buffer
			if code := run(t.Context(), []string{"version"}, &stdout, &stderr); code != 0 {
				t.Fatalf("exit code %d; stderr: %s", code, stderr.String())
			}
			if got := stdout.String(); got != tc.want {
				t.Errorf("kpar version printed %q, want %q", got, tc.want)
			}
		})
	}
	var stderr bytes.Buffer
	if code := run(t.Context(), []string{"version", "extra"}, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "extra") {
		t.Errorf("kpar version extra: exit %d, stderr %q; want 2 naming the argument", code, stderr.String())
	}
}
