package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestBrokerRefusesADataDirWhoseShareGroupsWereLost: kfake saves share
// groups' progress only on a clean stop. `kpar broker --data-dir` restarts
// after SIGTERM with the share group's progress; after SIGKILL it refuses
// to start (exit 1, naming the group and --forget-share-groups) rather than
// let the group's members skip records, as a running member did (658 of
// 3,000 in the probe); --forget-share-groups starts it anyway.
func TestBrokerRefusesADataDirWhoseShareGroupsWereLost(t *testing.T) {
	t.Parallel()
	skipOnRealCluster(t, "it kills and restarts the broker")
	bin, ctx := e2e(t, 2*time.Minute)
	dir := t.TempDir()
	broker, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1", "--data-dir", dir)
	const n = 20
	produceIndexed(ctx, t, "shared", n, 5, kgo.SeedBrokers(addr))
	ep := newEndpoint(t, func(int, int) reply { return reply{} })
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--share-group", "sg", "--topic", "shared", "--url", ep.srv.URL, "--log-level", "warn")
	ep.waitFor(ctx, t, p, "every record delivered", func() bool { return ep.delivered() == n })
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Fatalf("kpar forward exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}

	// A clean stop keeps the group: the broker starts again.
	if err := broker.signal(ctx, t, syscall.SIGTERM); err != nil {
		t.Fatalf("broker after SIGTERM: %v; stderr:\n%s", err, broker.stderr)
	}
	note, err := os.ReadFile(filepath.Join(dir, shareStateFile))
	if err != nil || !strings.Contains(string(note), `"share_groups":["sg"]`) || !strings.Contains(string(note), `"stopped_cleanly":true`) {
		t.Fatalf("after a clean stop, %s = %q, %v; want sg, stopped cleanly", shareStateFile, note, err)
	}
	broker, _ = startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1", "--data-dir", dir)

	// A kill loses it: the next start is refused, naming the group.
	if err := broker.signal(ctx, t, syscall.SIGKILL); err == nil {
		t.Fatal("the broker exited cleanly after SIGKILL")
	}
	cmd := exec.CommandContext(ctx, bin, "broker", "--listen", "127.0.0.1:0", "--data-dir", dir)
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("broker after a kill: exit code %d (%v), want 1; output:\n%s", code, err, out)
	}
	for _, want := range []string{"held share groups (sg)", "did not stop cleanly", "--forget-share-groups"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if strings.Count(string(out), "\n") != 1 {
		t.Errorf("the refusal is not one line:\n%s", out)
	}

	// --forget-share-groups starts it; the records are still there.
	broker, addr = startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1", "--data-dir", dir, "--forget-share-groups")
	if got := endOffsets(ctx, t, addr, "shared")[0]; got != n {
		t.Errorf("after --forget-share-groups the topic ends at %d, want %d", got, n)
	}
	if err := broker.signal(ctx, t, syscall.SIGTERM); err != nil {
		t.Fatalf("broker after SIGTERM: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, shareStateFile)); !os.IsNotExist(err) {
		t.Errorf("%s is still there after --forget-share-groups and no share group since: %v", shareStateFile, err)
	}
}
