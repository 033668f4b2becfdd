package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/forward"
)

// flagSet is a flag.FlagSet that also reads KPAR_<FLAG> environment
// variables and reports bad usage as one line naming the flag.
type flagSet struct {
	*flag.FlagSet
	stderr io.Writer
	usage  func()
}

func newFlagSet(name, synopsis string, stderr io.Writer) *flagSet {
	fs := flag.NewFlagSet("kpar "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := &flagSet{FlagSet: fs, stderr: stderr}
	// flag calls Usage on every parse error; keep those errors to one line
	// and print the full usage only for --help (see parse).
	fs.Usage = func() {}
	f.usage = func() {
		fmt.Fprintf(stderr, "usage: kpar %s [flags]%s\n\nflags (each also read from KPAR_<FLAG>):\n", name, synopsis)
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return f
}

// envName is the environment variable that sets a flag: KPAR_DLQ_TOPIC for
// --dlq-topic.
func envName(flagName string) string {
	return "KPAR_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parse parses args, then fills every flag not given on the command line
// from its environment variable. It returns (exit code, false) when the
// caller must stop: 0 after --help, 2 after bad usage.
func (f *flagSet) parse(args []string) (int, bool) {
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.usage()
			return 0, false
		}
		// flag names flags with one dash ("invalid value ... for flag
		// -ordering"); kpar's usage writes two.
		fmt.Fprintf(f.stderr, "%s: %s\n", f.Name(), strings.Replace(err.Error(), "for flag -", "for flag --", 1))
		return 2, false
	}
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var bad error
	f.VisitAll(func(fl *flag.Flag) {
		if set[fl.Name] || bad != nil {
			return
		}
		if v, ok := os.LookupEnv(envName(fl.Name)); ok {
			if err := fl.Value.Set(v); err != nil {
				bad = fmt.Errorf("invalid value %q for %s (flag --%s): %v", v, envName(fl.Name), fl.Name, err)
			}
		}
	})
	if bad != nil {
		fmt.Fprintf(f.stderr, "%s: %v\n", f.Name(), bad)
		return 2, false
	}
	return 0, true
}

// parseArgs is parse, then the usage error of a positional argument or of
// the first flag of required left blank.
func (f *flagSet) parseArgs(args []string, required ...string) (int, bool) {
	if code, ok := f.parse(args); !ok {
		return code, false
	}
	if f.NArg() > 0 {
		return f.usageError("unexpected argument %q", f.Arg(0)), false
	}
	for _, name := range required {
		if strings.TrimSpace(f.Lookup(name).Value.String()) == "" {
			return f.usageError("missing --%s (or %s)", name, envName(name)), false
		}
	}
	return 0, true
}

// usageError prints a one-line usage error naming the flag and returns 2.
func (f *flagSet) usageError(format string, a ...any) int {
	fmt.Fprintf(f.stderr, "%s: %s\n", f.Name(), fmt.Sprintf(format, a...))
	return 2
}

// addLogLevel defines --log-level, which kpar forward and kpar backfill
// share; logger reads it.
func addLogLevel(fs *flagSet) *string {
	return fs.String("log-level", "info", "log `level`: debug, info, warn or error")
}

// logger is the text logger on the flag set's stderr at level (the value
// of --log-level), or the usage error of a bad level.
func (f *flagSet) logger(level string) (*slog.Logger, int, bool) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, f.usageError("invalid --log-level %q: use debug, info, warn or error", level), false
	}
	return slog.New(slog.NewTextHandler(f.stderr, &slog.HandlerOptions{Level: l})), 0, true
}

// forwarder is what kpar forward and kpar backfill make once their flags
// are checked: the forward.Handler of --url (target) with opts, and the
// client options of the security flags; each failure is a usage error.
func (f *flagSet) forwarder(target string, sec *securityOpts, opts ...forward.Opt) (*forward.Handler, []kgo.Opt, int, bool) {
	h, err := forward.New(target, opts...)
	if err != nil {
		return nil, nil, f.usageError("invalid --url: %v", strings.TrimPrefix(err.Error(), "forward: ")), false
	}
	secOpts, err := sec.kgoOpts()
	if err != nil {
		h.CloseIdleConnections()
		return nil, nil, f.usageError("%v", err), false
	}
	return h, secOpts, 0, true
}

// attemptFlags are the failure-path flags that kpar forward and kpar
// backfill share, read, checked and turned into options in one place.
type attemptFlags struct {
	maxAttempts                                *int
	backoff, backoffMax, timeout, shutdownWait *time.Duration
	hangLimit                                  *time.Duration // kpar.HangLimit (hang.go)
}

// addAttemptFlags defines the attempt flags on fs; maxAttemptsHelp says
// where an exhausted record goes.
func addAttemptFlags(fs *flagSet, maxAttemptsHelp string) attemptFlags {
	return attemptFlags{
		maxAttempts:  fs.Int("max-attempts", 3, maxAttemptsHelp),
		backoff:      fs.Duration("retry-backoff", 100*time.Millisecond, "base of the jittered exponential backoff between attempts"),
		backoffMax:   fs.Duration("retry-backoff-max", 10*time.Second, "cap of the backoff between attempts"),
		timeout:      fs.Duration("attempt-timeout", 10*time.Second, "time limit of one request, response included"),
		shutdownWait: fs.Duration("shutdown-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests may take to finish before they are cancelled"),
		hangLimit: fs.Duration("hang-limit", 2*time.Minute, "a record whose requests keep timing out while the endpoint answers other records is dead-lettered (class timeout, \"hung the downstream\") within `D` of the last answer; "+
			"while other records time out or are refused too, or three or more hang at once with nothing answered since, the endpoint is down and nothing is dead-lettered; 0 holds such a record until it succeeds"),
	}
}

// check returns the usage error of the first bad value, naming its flag.
func (a attemptFlags) check(fs *flagSet) (code int, ok bool) {
	switch {
	case *a.maxAttempts < 1:
		return fs.usageError("invalid --max-attempts %d: want 1 or more", *a.maxAttempts), false
	case *a.backoff <= 0:
		return fs.usageError("invalid --retry-backoff %v: want more than 0", *a.backoff), false
	case *a.backoffMax < *a.backoff:
		return fs.usageError("invalid --retry-backoff-max %v: want at least --retry-backoff (%v)", *a.backoffMax, *a.backoff), false
	case *a.timeout <= 0:
		return fs.usageError("invalid --attempt-timeout %v: want more than 0", *a.timeout), false
	case *a.hangLimit < 0:
		return fs.usageError("invalid --hang-limit %v: want 0 (off) or more", *a.hangLimit), false
	case *a.shutdownWait <= 0:
		return fs.usageError("invalid --shutdown-timeout %v: want more than 0", *a.shutdownWait), false
	}
	return 0, true
}

// opts are the kpar options the flags set.
func (a attemptFlags) opts() []kpar.FlowOpt {
	return []kpar.FlowOpt{
		kpar.MaxAttempts(*a.maxAttempts),
		kpar.RetryBackoff(*a.backoff, *a.backoffMax),
		kpar.AttemptTimeout(*a.timeout),
		kpar.ShutdownTimeout(*a.shutdownWait),
		kpar.HangLimit(*a.hangLimit),
	}
}
