package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kpar/kpar/internal/ledger"
)

// TestBrokerRestartUnderEachProtocol SIGKILLs `kpar broker --data-dir`
// while `kpar forward` delivers, keeps it down for 4s and restarts it, under
// each group protocol: the member is forgotten by the restarted broker
// (UNKNOWN_MEMBER_ID) and loses its partitions without a commit, then gets
// them back. What it finished before is finished still: re-delivered are at
// most the records in flight when it lost them (issue 35: 940 duplicates
// with the consumer protocol, 0 with the classic one). And /readyz answers
// 503 during the outage (it stayed 200 with the consumer protocol).
func TestBrokerRestartUnderEachProtocol(t *testing.T) {
	for _, protocol := range []string{"classic", "consumer"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			skipOnRealCluster(t, "it kills and restarts the broker")
			const partitions, keys, concurrency, perPhase = 4, 200, 8, 2000
			bin, ctx := e2e(t, 3*time.Minute)
			dir := t.TempDir()
			broker, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", strconv.Itoa(partitions), "--data-dir", dir)
			const topic, group = "restart", "restart"
			l := ledger.New(ledger.ByKey, 0)
			ep := newLedgerEndpoint(t, l, topic, func(i, _ int) (int, time.Duration) {
				return http.StatusOK, time.Duration(i%5) * time.Millisecond
			})
			produceLedger(ctx, t, addr, topic, 0, perPhase, keys, l)
			p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", group, "--topic", topic, "--url", ep.srv.URL,
				"--concurrency", strconv.Itoa(concurrency), "--ordering", "key", "--retry-backoff", "5ms",
				"--session-timeout", "6s", "--group-protocol", protocol, "--metrics-listen", "127.0.0.1:0")
			waitReached(t, l, perPhase/3, time.Minute, "deliveries before the broker's kill")
			status := statusAddr(t, p)

			// Watch /readyz from the kill until the restarted broker answers.
			var (
				mu       sync.Mutex
				notReady []string
			)
			watchCtx, stopWatch := context.WithCancel(ctx)
			var watching sync.WaitGroup
			watching.Go(func() {
				for watchCtx.Err() == nil {
					if code, body := readyz(watchCtx, status); code == http.StatusServiceUnavailable {
						mu.Lock()
						notReady = append(notReady, strings.TrimSpace(body))
						mu.Unlock()
					}
					select {
					case <-watchCtx.Done():
					case <-time.After(200 * time.Millisecond):
					}
				}
			})
			atKill := l.Report().Handled
			if err := broker.signal(ctx, t, syscall.SIGKILL); err == nil {
				t.Fatal("the broker exited cleanly after SIGKILL")
			}
			time.Sleep(4 * time.Second) // the outage
			broker, _ = startBrokerProcess(ctx, t, bin, "--listen", addr, "--partitions", strconv.Itoa(partitions), "--data-dir", dir)
			_ = broker
			produceLedger(ctx, t, addr, topic, perPhase, 2*perPhase, keys, l)
			stopWatch()
			watching.Wait()
			waitReached(t, l, 2*perPhase, 2*time.Minute, "every record after the restart")
			if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
				t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
			}
			checkCommittedAtEnd(ctx, t, addr, group, topic)
			rep := l.Report()
			t.Logf("%s: broker killed after %d records delivered, down 4s; %+v", protocol, atKill, rep)
			if len(notReady) == 0 {
				t.Errorf("/readyz never answered 503 while the broker was down")
			} else {
				t.Logf("GET /readyz during the outage: %s", notReady[len(notReady)/2])
			}
			// The records in flight when the partitions were lost, and those
			// a worker had taken: a few per worker.
			if err := rep.Check(2 * concurrency); err != nil {
				t.Errorf("%v; stderr:\n%s", err, tail(p.stderr))
			}
		})
	}
}
