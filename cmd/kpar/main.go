// Command kpar runs the kpar engine from the command line: a demo on an
// embedded broker, a development broker, an HTTP forwarder, dead-letter tools
// and side-by-side benchmarks.
//
// Every flag can also be set through an environment variable named
// KPAR_<FLAG>, upper case with dashes as underscores (KPAR_BROKERS for
// --brokers). A flag given on the command line wins over its variable.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand. run returns the process exit code: 0 for
// success, 1 for a failure while running, 2 for bad usage.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"demo", "consume a generated topic on an embedded broker and report loss, duplicates and order", cmdDemo},
		{"broker", "run a Kafka-compatible development broker (franz-go's kfake)", cmdBroker},
		{"forward", "consume a topic and POST every record to an HTTP endpoint", cmdForward},
		{"backfill", "POST every record of a fixed offset or time range to an HTTP endpoint, several readers per partition", cmdBackfill},
		{"dlq", "list, analyse and replay dead letters (stats, list, replay)", cmdDLQ},
		{"bench", "run side-by-side benchmarks: kpar vs the raw franz-go loop and others", cmdBench},
		{"version", "print the kpar version and the VCS revision it was built from", cmdVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first SIGINT or SIGTERM asks for a graceful stop; restoring
		// the default action makes a second one stop the process at once.
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "kpar: unknown command %q; run 'kpar --help' for the list\n", args[0])
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kpar COMMAND [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'kpar COMMAND --help' for a command's flags. Every flag also reads KPAR_<FLAG>.")
}
