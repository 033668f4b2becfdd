package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// kpar forward asks the library about the options its flags make, before
// it contacts anything, and reports a refusal as one usage line in the
// flags' words: the rules of which options go together live in the
// library alone.
func TestForwardReportsTheLibrarysRefusalInFlagWords(t *testing.T) {
	base := []string{"--brokers", "127.0.0.1:1", "--topic", "t", "--url", "http://127.0.0.1:1/"}
	share := append([]string{"--share-group", "sg"}, base...)
	group := append([]string{"--group", "g"}, base...)
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"group and share group", append([]string{"--group", "g"}, share...), "both --group and --share-group given"},
		{"share group by partition", append([]string{"--ordering", "partition"}, share...), "--ordering partition cannot be kept with --share-group"},
		{"share group protocol", append([]string{"--group-protocol", "consumer"}, share...), "--group-protocol consumer is not supported with --share-group"},
		{"share group exactly once", append([]string{"--exactly-once"}, share...), "--exactly-once is not supported with --share-group"},
		{"share group retry topics", append([]string{"--retry-topics", "1s"}, share...), "--retry-topics is not supported with --share-group"},
		{"commit interval", append([]string{"--commit-interval", "0s"}, group...), "--commit-interval 0s out of range"},
		{"commit budget", append([]string{"--commit-budget", "-1"}, group...), "--commit-budget -1 out of range"},
		{"concurrency", append([]string{"--concurrency", "0"}, group...), "--concurrency 0 out of range"},
		{"retry delay", append([]string{"--retry-topics", "1s,0s"}, group...), "--retry-topics delay 2 is 0s"},
		{"bad regex", []string{"--brokers", "h:1", "--group", "g", "--url", "http://x/", "--topic-regex", "("}, `--topic-regex "(": error parsing regexp`},
		{"regex and retry topics", []string{"--brokers", "h:1", "--group", "g", "--url", "http://x/", "--topic-regex", "t.*", "--retry-topics", "1s"}, "--retry-topics cannot be combined with --topic-regex"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withoutKparEnv(t)
			var stdout, stderr bytes.Buffer
			if code := cmdForward(t.Context(), tc.args, &stdout, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			want := "kpar forward: " + tc.says
			if msg := stderr.String(); strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, want) || strings.Contains(msg, "kpar: ") {
				t.Errorf("stderr = %q, want one line starting %q", msg, want)
			}
		})
	}
}

// Names the translation does not know stay as the library wrote them.
func TestLibraryRefusalKeepsUnknownNames(t *testing.T) {
	got := libraryRefusal(errors.New("kpar: WindowRecords(2) out of range: want 4 to 16777216; Ordering(7) unknown"))
	if want := "WindowRecords(2) out of range: want 4 to 16777216; --ordering 7 unknown"; got != want {
		t.Errorf("libraryRefusal = %q, want %q", got, want)
	}
}

// --check-config --exactly-once with a Kafka dead-letter sink is a valid
// configuration: the dry run's stand-in sink is a Kafka sink too (it was
// refused as "not main.dryRunSink").
func TestForwardCheckConfigAcceptsExactlyOnce(t *testing.T) {
	withoutKparEnv(t)
	var stdout, stderr bytes.Buffer
	code := cmdForward(t.Context(), []string{"--check-config", "--brokers", "127.0.0.1:1", "--group", "g", "--topic", "t",
		"--url", "http://127.0.0.1:1/", "--reply-topic", "r", "--exactly-once", "--instance-id", "i"}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "exactly_once: true") {
		t.Errorf("exit code %d, want 0 and exactly_once: true; stdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
}
