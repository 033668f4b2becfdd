package main

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/ledger"
)

// TestChaosBrokerRestart SIGKILLs `kpar broker --data-dir` while `kpar
// forward` is delivering, and restarts it on the same port and directory:
// the forwarder must recover by itself (no restart, no exit) and lose
// nothing, records produced before the kill and after the restart alike,
// with per-key order kept.
//
// What kfake keeps over a SIGKILL: it writes each produced batch to its
// segment file and each commit to groups.log before answering, so records
// and committed offsets that were acknowledged are back after the restart
// (from the page cache: nothing is fsynced). It keeps group membership only
// on a clean Close, so the member's heartbeat after the restart gets
// UNKNOWN_MEMBER_ID: it rejoins, its partitions count as lost, and what it
// finished after its last commit landed is delivered again. The test
// bounds those duplicates by the window (WindowRecords) per partition.
//
// The default is one kill for CI; KPAR_CHAOS_SOAK=1 kills the broker 5
// times over a larger topic.
func TestChaosBrokerRestart(t *testing.T) {
	t.Parallel()
	skipOnRealCluster(t, "it kills and restarts the broker")
	kills, perPhase := 1, 2000
	if os.Getenv("KPAR_CHAOS_SOAK") != "" {
		kills, perPhase = 5, 5000
	}
	const partitions, keys, concurrency, window = 4, 200, 8, 1000
	bin := buildKpar(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	broker, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", strconv.Itoa(partitions), "--data-dir", dir)
	const topic, group = "restart", "restart"

	l := ledger.New(ledger.ByKey, 0)
	ep := newLedgerEndpoint(t, l, topic, func(i, _ int) (int, time.Duration) {
		return http.StatusOK, time.Duration(i%5) * time.Millisecond // slow enough that the kill falls mid-run
	})
	produced := 0
	produceMore := func() {
		produceLedger(ctx, t, addr, topic, produced, produced+perPhase, keys, l)
		produced += perPhase
	}
	produceMore()
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", group, "--topic", topic, "--url", ep.srv.URL,
		"--concurrency", strconv.Itoa(concurrency), "--ordering", "key", "--retry-backoff", "5ms",
		"--session-timeout", "6s", "--log-level", "warn")
	var downFor []time.Duration
	var atKill []int64 // records delivered when the broker died
	for k := range kills {
		// Kill when about a third of what is produced so far is through.
		before := l.Report()
		waitReached(t, l, before.Handled+int64(perPhase/3), time.Minute, "deliveries before the broker's kill")
		atKill = append(atKill, l.Report().Handled)
		if err := broker.signal(ctx, t, syscall.SIGKILL); err == nil {
			t.Fatal("the broker exited cleanly after SIGKILL")
		}
		down := time.Now()
		broker, _ = startBrokerProcess(ctx, t, bin, "--listen", addr, "--partitions", strconv.Itoa(partitions), "--data-dir", dir)
		downFor = append(downFor, time.Since(down))
		select {
		case <-p.exited:
			t.Fatalf("kpar forward exited (%v) after broker restart %d; stderr:\n%s", p.waitErr, k+1, tail(p.stderr))
		default:
		}
		produceMore()
	}
	waitReached(t, l, int64(produced), 2*time.Minute, "every record after the restarts")
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	checkCommittedAtEnd(ctx, t, addr, group, topic)
	rep := l.Report()
	t.Logf("%d broker SIGKILLs (after %v records delivered; down %v each), %d records: %+v", kills, atKill, downFor, produced, rep)
	if bad := ep.malformed(); len(bad) > 0 {
		t.Errorf("malformed requests: %q", bad)
	}
	if err := rep.Check(int64(kills * partitions * window)); err != nil {
		t.Error(err)
	}
}

// produceLedger produces the records from .. to (key "k<i mod keys>",
// value "<i>") and waits for their acknowledgements, noting each in l.
func produceLedger(ctx context.Context, t *testing.T, addr, topic string, from, to, keys int, l *ledger.Ledger) {
	t.Helper()
	cl := newClient(t, addr, kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation())
	defer cl.Close()
	rs := make([]*kgo.Record, 0, to-from)
	for i := from; i < to; i++ {
		rs = append(rs, &kgo.Record{Key: []byte("k" + strconv.Itoa(i%keys)), Value: []byte(strconv.Itoa(i))})
	}
	res := cl.ProduceSync(ctx, rs...)
	if err := res.FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	for _, r := range res {
		l.Produced(r.Record)
	}
}

// TestShareRecoversFromBrokerRestart SIGKILLs an in-memory `kpar broker`
// while `kpar forward --share-group` runs, and starts a new one on the same
// address: every record produced to the new broker's topic arrives, with no
// restart of the forwarder. The new broker knows neither the topic's ID
// nor the share group: the forwarder must subscribe to the topic afresh
// (UNKNOWN_TOPIC_ID) and set share.auto.offset.reset=earliest on the group
// again, or it reads from the newest record on and skips what was produced
// meanwhile, as it used to, for good.
func TestShareRecoversFromBrokerRestart(t *testing.T) {
	t.Parallel()
	skipOnRealCluster(t, "it kills and restarts the broker")
	const perPhase, keys = 200, 20
	bin := buildKpar(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	broker, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2")
	const topic = "share-restart"
	l := ledger.New(ledger.Unordered, 0)
	ep := newLedgerEndpoint(t, l, topic, func(int, int) (int, time.Duration) { return http.StatusOK, 0 })
	produceLedger(ctx, t, addr, topic, 0, perPhase, keys, l)
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--share-group", "sg", "--topic", topic, "--url", ep.srv.URL,
		"--retry-backoff", "5ms", "--log-level", "warn")
	waitReached(t, l, perPhase, time.Minute, "deliveries before the broker's kill")
	if err := broker.signal(ctx, t, syscall.SIGKILL); err == nil {
		t.Fatal("the broker exited cleanly after SIGKILL")
	}
	startBrokerProcess(ctx, t, bin, "--listen", addr, "--partitions", "2")
	// The new topic's records take the old one's partitions and offsets: a
	// ledger of their own.
	l2 := ledger.New(ledger.Unordered, 0)
	ep.mu.Lock()
	ep.l = l2
	ep.mu.Unlock()
	produceLedger(ctx, t, addr, topic, perPhase, 2*perPhase, keys, l2)
	waitReached(t, l2, perPhase, time.Minute, "the records produced after the restart")
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	for _, l := range []*ledger.Ledger{l, l2} {
		if err := l.Report().Check(0); err != nil {
			t.Error(err)
		}
	}
}
