package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/testkit"
)

// TestBrokerCompletesATransactionAKillCutInHalf: kfake commits a
// transaction in two steps, its COMMIT markers and then its offset
// commits, and a kill -9 between the two left the transaction's records
// readable while the group's offsets did not cover its inputs: they were
// handled again, and a read_committed reader saw their outputs twice (the
// fault matrix's broker restarts under --exactly-once). The test makes the
// cut by hand, truncating groups.log to what it held before the commit,
// and wants the restarted broker to complete the commit from its journal.
// A cut between two partitions' markers cannot be completed (kfake aborts
// the unmarked partition as it loads it): the broker aborts it there,
// commits no offset (that would lose the aborted record's output), and
// says so.
func TestBrokerCompletesATransactionAKillCutInHalf(t *testing.T) {
	t.Parallel()
	skipOnRealCluster(t, "it kills the broker and truncates its files")
	for _, tc := range []struct {
		name       string
		cutMarkers bool // the marker of txns/1 too
	}{
		{name: "offsets cut"},
		{name: "offsets and a marker cut", cutMarkers: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin, ctx := e2e(t, 2*time.Minute)
			dir := t.TempDir()
			start := func() (*brokerProcess, string) {
				return startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2", "--data-dir", dir)
			}
			broker, addr := start()
			cl := newClient(t, addr, kgo.TransactionalID("t1"), kgo.DefaultProduceTopic("txns"), kgo.AllowAutoTopicCreation(),
				kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
			if err := cl.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			for _, v := range []string{"a", "b"} {
				if err := cl.ProduceSync(ctx, kgo.StringRecord(v)).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			meta := "m"
			if err := testkit.CommitOffsetsInTxn(ctx, cl, "t1", "g", "txns", map[int32]int64{0: 7, 1: 7}, &meta); err != nil {
				t.Fatal(err)
			}

			// What the files held before the commit.
			groupsLog := filepath.Join(dir, "groups.log")
			sizes := map[string]int64{groupsLog: fileSize(t, groupsLog)}
			p1 := filepath.Join(dir, "partitions", "txns-1")
			if tc.cutMarkers {
				files, _ := filepath.Glob(filepath.Join(p1, "*"))
				for _, f := range files {
					sizes[f] = fileSize(t, f)
				}
			}
			if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
			cl.Close()
			if err := broker.signal(ctx, t, syscall.SIGKILL); err == nil {
				t.Fatal("the broker exited cleanly after SIGKILL")
			}
			for f, size := range sizes {
				if err := os.Truncate(f, size); err != nil {
					t.Fatal(err)
				}
			}

			broker, addr = start()
			var line string
			wait, cancel := context.WithTimeout(ctx, 30*time.Second)
			select {
			case line = <-broker.stderr.first:
			case <-wait.Done():
			}
			cancel()
			adm := kadm.NewClient(newClient(t, addr))
			if tc.cutMarkers {
				if !strings.Contains(line, "died while it wrote a transaction's COMMIT markers") || !strings.Contains(line, "(txns/1)") {
					t.Errorf("the restarted broker does not say the transaction stays half committed in txns/1; stderr:\n%s", line)
				}
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if got := readCommitted(rctx, t, addr, "txns", 2); len(got) != 1 || got[0].Partition != 0 {
					t.Errorf("read_committed returns %d records, want the one of txns/0", len(got))
				}
				cancel()
				if offs, err := adm.FetchOffsets(ctx, "g"); err == nil {
					if o, ok := offs.Lookup("txns", 1); ok && o.Err == nil && o.At >= 0 {
						t.Errorf("group g has offset %d for txns/1, want none: its record was aborted", o.At)
					}
				}
			} else {
				if !strings.Contains(line, "completed their commits") {
					t.Errorf("the restarted broker does not say it completed the transaction; stderr:\n%s", line)
				}
				if got := readCommitted(ctx, t, addr, "txns", 2); len(got) != 2 {
					t.Errorf("read_committed returns %d of the transaction's 2 records", len(got))
				}
				offs, err := adm.FetchOffsets(ctx, "g")
				if err != nil {
					t.Fatal(err)
				}
				for p := range int32(2) {
					if o, ok := offs.Lookup("txns", p); !ok || o.At != 7 || o.Metadata != "m" {
						t.Errorf("group g's offset of txns/%d is %+v, want the transaction's 7 %q", p, o, "m")
					}
				}
			}
			if err := broker.signal(ctx, t, syscall.SIGTERM); err != nil {
				t.Fatalf("broker after SIGTERM: %v", err)
			}
		})
	}
}

// fileSize is the size of file f.
func fileSize(t *testing.T, f string) int64 {
	t.Helper()
	fi, err := os.Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
