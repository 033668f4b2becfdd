package main

import (
	"strings"
	"testing"
)

// TestForwardInstanceIDHelpSaysWhatEachProtocolDoes: the help of
// --instance-id promised the partitions back "at once" after any restart;
// in the consumer protocol a member restarted after a kill -9 waits for
// the dead member's session (UNRELEASED_INSTANCE_ID, 49 s measured).
func TestForwardInstanceIDHelpSaysWhatEachProtocolDoes(t *testing.T) {
	var stdout, stderr strings.Builder
	if code := cmdForward(t.Context(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help: exit code %d", code)
	}
	_, help, _ := strings.Cut(stderr.String(), "\n  -instance-id")
	help, _, _ = strings.Cut(help, "\n  -")
	help = strings.Join(strings.Fields(help), " ")
	for _, want := range []string{"Classic protocol", "after a clean stop or a kill -9", "Consumer protocol: at once only after a clean stop", "UNRELEASED_INSTANCE_ID"} {
		if !strings.Contains(help, want) {
			t.Errorf("the help of --instance-id does not say %q:\n%s", want, help)
		}
	}
}
