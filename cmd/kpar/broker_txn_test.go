package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestBrokerAbortsTheTransactionsAKillLeftOpen: a transaction open when
// `kpar broker --data-dir` is killed is aborted when it starts again, with
// an ABORT marker in each partition it wrote to, and says so on stderr.
// Without the marker (kfake aborts such a transaction in memory only), a
// read_committed reader skips every later batch of the same producer in
// its fetch, committed or not: the committed transaction after the restart
// was never read. A clean stop keeps the open transaction for its producer
// to end, so nothing is aborted then.
func TestBrokerAbortsTheTransactionsAKillLeftOpen(t *testing.T) {
	t.Parallel()
	skipOnRealCluster(t, "it kills and restarts the broker")
	bin, ctx := e2e(t, 2*time.Minute)
	dir := t.TempDir()
	start := func() (*brokerProcess, string) {
		return startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2", "--data-dir", dir)
	}
	broker, addr := start()
	const topic = "txns"

	// A transaction committed, then one left open by the kill.
	transact(ctx, t, addr, "before", 0, 4, true)
	transact(ctx, t, addr, "open", 0, 4, false)
	if err := broker.signal(ctx, t, syscall.SIGKILL); err == nil {
		t.Fatal("the broker exited cleanly after SIGKILL")
	}

	broker, addr = start()
	var line string
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	select { // written before the "listening" line, but through a pipe of its own
	case line = <-broker.stderr.first:
	case <-wait.Done():
	}
	cancel()
	if !strings.Contains(line, "did not stop cleanly") || !strings.Contains(line, "aborted the 1 transaction(s) it left open (in txns/0, txns/1)") {
		t.Errorf("the restarted broker does not say it aborted the open transaction in txns/0 and txns/1; stderr:\n%s", line)
	}
	// The same transactional ID after the restart: the same producer ID.
	transact(ctx, t, addr, "after", 0, 4, true)
	checkCommittedValues(ctx, t, addr, topic, "before", "after")

	// A clean stop with a transaction open: restored, nothing aborted.
	transact(ctx, t, addr, "open-at-stop", 0, 4, false)
	if err := broker.signal(ctx, t, syscall.SIGTERM); err != nil {
		t.Fatalf("broker after SIGTERM: %v; stderr:\n%s", err, broker.stderr)
	}
	broker, addr = start()
	if line := broker.stderr.String(); strings.Contains(line, "aborted") {
		t.Errorf("the broker aborted transactions after a clean stop; stderr:\n%s", line)
	}
	transact(ctx, t, addr, "last", 0, 4, true)
	checkCommittedValues(ctx, t, addr, topic, "before", "after", "last")
	if err := broker.signal(ctx, t, syscall.SIGTERM); err != nil {
		t.Fatalf("broker after SIGTERM: %v", err)
	}
}

// transact produces n records "<name>-<i>" (keys spread over the topic's
// partitions) to topic txns in one transaction of transactional ID "t1",
// and commits it, or leaves it open when !commit.
func transact(ctx context.Context, t *testing.T, addr, name string, from, n int, commit bool) {
	t.Helper()
	cl := newClient(t, addr, kgo.TransactionalID("t1"), kgo.DefaultProduceTopic("txns"), kgo.AllowAutoTopicCreation(),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := from; i < from+n; i++ {
		if err := cl.ProduceSync(ctx, kgo.StringRecord(fmt.Sprintf("%s-%d", name, i))).FirstErr(); err != nil {
			t.Fatalf("producing %s: %v", name, err)
		}
	}
	if !commit {
		return // Close does not end it
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("committing %s: %v", name, err)
	}
}

// checkCommittedValues reads topic read_committed and wants exactly the
// records of the transactions named, four each.
func checkCommittedValues(ctx context.Context, t *testing.T, addr, topic string, names ...string) {
	t.Helper()
	var want, got []string
	for _, name := range names {
		for i := range 4 {
			want = append(want, fmt.Sprintf("%s-%d", name, i))
		}
	}
	for _, r := range readCommitted(ctx, t, addr, topic, len(want)) {
		got = append(got, string(r.Value))
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("read_committed returns %q, want %q", got, want)
	}
}
