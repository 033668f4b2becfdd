package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// checkConfig is kpar forward's --check-config: a dry run that validates
// every flag, every KPAR_* variable and the combination of options (all
// that the daemon checks before it connects), prints what the daemon would
// do, and exits 0, or 2 for a bad configuration. The brokers, the endpoint
// and the dead-letter sink are never contacted, so that a manifest can be
// checked where none of them exists (deploy/'s test does so for every
// overlay).
//
// cmdForward runs its usual checks and asks checkConfig at the three
// places where the daemon would reach outside: opening the dead-letter
// sink, serving the status port, and starting.
type checkConfig struct {
	on    *bool
	flags *flagSet
}

// addCheckConfig defines --check-config on the forward flag set.
func addCheckConfig(fs *flagSet) checkConfig {
	return checkConfig{
		on:    fs.Bool("check-config", false, "validate the flags, the KPAR_* variables and their combination, print what kpar forward would do, and exit 0, or 2 for a bad configuration; contacts neither the brokers, nor the endpoint, nor the dead-letter sink"),
		flags: fs,
	}
}

func (cc checkConfig) enabled() bool { return *cc.on }

// openSink opens the dead-letter sink, or in a dry run stands in for it
// with one that takes nothing: a file sink would create its file, a
// PostgreSQL sink would connect. A Kafka sink stands in as itself on a
// client that is never used (a kgo client connects on its first request),
// so that the library sees the kind of sink --exactly-once needs.
func (cc checkConfig) openSink(ctx context.Context, s deadLetterSink, seeds []string, secOpts []kgo.Opt, log *slog.Logger) (deadletter.Sink, func(), error) {
	switch {
	case !cc.enabled():
		return s.open(ctx, seeds, secOpts, log)
	case s.scheme == "kafka":
		cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
		if err != nil {
			return nil, nil, err
		}
		return deadletter.NewKafkaSink(cl), cl.Close, nil
	}
	return dryRunSink{}, func() {}, nil
}

// invalid is the exit code of a configuration the library refused: 2 in a
// dry run, whose contract is 0 or 2, else code.
func (cc checkConfig) invalid(code int) int {
	if cc.enabled() {
		return 2
	}
	return code
}

// report ends a dry run: a KPAR_* variable that names no flag of kpar
// forward is a bad configuration (the daemon would ignore it, which is how
// a misspelt KPAR_CONCURENCY goes unnoticed), else it prints attrs, the
// start line's fields, one "key: value" a line, then the status server's
// paths and the shutdown timeout, and returns 0.
func (cc checkConfig) report(stdout io.Writer, attrs []any) int {
	if unknown := cc.unknownEnv(os.Environ()); len(unknown) > 0 {
		return cc.flags.usageError("unknown %s: no flag of kpar forward reads %s; run 'kpar forward --help' for the list",
			strings.Join(unknown, ", "), map[bool]string{true: "them", false: "it"}[len(unknown) > 1])
	}
	fmt.Fprintln(stdout, "kpar forward --check-config: the configuration is valid; kpar forward would run with:")
	for i := 0; i+1 < len(attrs); i += 2 {
		fmt.Fprintf(stdout, "  %s: %v\n", attrs[i], attrs[i+1])
		if attrs[i] == "metrics_listen" {
			// What the kubelet's probes and Prometheus may ask for
			// (statusHandler, serve.go).
			fmt.Fprintf(stdout, "  status_paths: %s\n", strings.Join(statusPaths, ","))
		}
	}
	// Not on the start line, but what a pod's grace period must exceed.
	fmt.Fprintf(stdout, "  shutdown_timeout: %s\n", cc.flags.Lookup("shutdown-timeout").Value)
	if f := cc.flags.Lookup("schema-registry"); f != nil && f.Value.String() != "" {
		fmt.Fprintln(stdout, "not contacted: the brokers, the --url endpoint, the dead-letter sink and the schema registry")
		return 0
	}
	fmt.Fprintln(stdout, "not contacted: the brokers, the --url endpoint and the dead-letter sink")
	return 0
}

// statusPaths are the paths the status server answers (statusHandler).
var statusPaths = []string{"/", "/metrics", "/healthz", "/readyz", "/api/status"}

// unknownEnv lists the KPAR_* names in env that no flag of the set reads,
// sorted.
func (cc checkConfig) unknownEnv(env []string) []string {
	known := map[string]bool{}
	cc.flags.VisitAll(func(fl *flag.Flag) { known[envName(fl.Name)] = true })
	var unknown []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "KPAR_") && !known[name] {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	return unknown
}

// dryRunSink stands in for the dead-letter sink in a dry run, where
// nothing is consumed and so nothing is written.
type dryRunSink struct{}

func (dryRunSink) Write(context.Context, []deadletter.Letter) error { return nil }
