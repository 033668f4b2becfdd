package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
)

// version and revision are stamped by scripts/image.sh (and the
// Dockerfile) with -ldflags "-X main.version=... -X main.revision=...",
// which the image's OCI labels repeat. Left empty, buildInfo reads them
// from the Go build info: the module version (a tag or pseudo-version
// when built with VCS stamping, "(devel)" in a plain checkout build) and
// the vcs.revision setting.
var version, revision string

// build is what kpar version prints.
type build struct {
	version  string // module version, or the -X stamp
	revision string // VCS commit, "+dirty" when the tree had changes; "unknown" without VCS stamping
	goVer    string // toolchain
}

// buildInfo returns this binary's version and revision: the ldflags stamps
// when present, else the build info's.
func buildInfo() build {
	b := build{version: version, revision: revision, goVer: "unknown"}
	if info, ok := debug.ReadBuildInfo(); ok {
		b.goVer = info.GoVersion
		if b.version == "" {
			b.version = info.Main.Version
		}
		if b.revision == "" {
			var rev, modified string
			for _, s := range info.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if rev != "" && modified == "true" {
				rev += "+dirty"
			}
			b.revision = rev
		}
	}
	if b.version == "" {
		b.version = "(devel)"
	}
	if b.revision == "" {
		// GOFLAGS=-buildvcs=false, a build outside a repository, or
		// go run: nothing says which commit this is.
		b.revision = "unknown"
	}
	return b
}

// cmdVersion prints the version on the first line, then the revision and
// the toolchain, one "key: value" a line; scripts/image-test.sh compares
// them with the image's labels.
func cmdVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", "", stderr)
	if code, ok := fs.parseArgs(args); !ok {
		return code
	}
	b := buildInfo()
	fmt.Fprintf(stdout, "kpar %s\nrevision: %s\ngo: %s\n", b.version, b.revision, b.goVer)
	return 0
}
