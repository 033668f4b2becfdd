package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/internal/testkit"
)

// fakeWork is work a test sets: records held in memory, lag, and the
// partitions this member does not own (nil: none listed).
type fakeWork struct {
	held, lag atomic.Int64
	share     atomic.Bool
	unowned   *fakeUnowned
}

func (f *fakeWork) work() work {
	return work{
		partitions: func() []kpar.PartitionStats {
			if f.share.Load() {
				return nil
			}
			return []kpar.PartitionStats{{Topic: "t", Buffered: int(f.held.Load())}}
		},
		share: func() (kpar.ShareStats, bool) {
			return kpar.ShareStats{Acquired: int(f.held.Load())}, f.share.Load()
		},
		list: func(context.Context, []kpar.PartitionStats) listing {
			l := listing{lag: f.lag.Load(), lagKnown: true}
			if f.unowned != nil {
				l.unowned, l.unownedKnown = f.unowned.list()
			}
			return l
		},
	}
}

func member() (bool, string) { return true, "1 partition assigned in group g" }

// startWatch runs a stallWatch with grace on w in the test's bubble until
// the test ends.
func startWatch(t *testing.T, grace time.Duration, w *fakeWork) *stallWatch {
	s := newStallWatch(grace)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.run(ctx, w.work()) }()
	t.Cleanup(func() { cancel(); <-done })
	synctest.Wait()
	return s
}

// wait advances the bubble's clock by d and lets the sampler catch up.
func wait(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func wantReady(t *testing.T, s *stallWatch, when string) {
	t.Helper()
	if ok, why := s.ready(member); !ok {
		t.Errorf("%s: not ready (%s), want ready", when, why)
	}
}

func wantNotReady(t *testing.T, s *stallWatch, when string, says ...string) {
	t.Helper()
	ok, why := s.ready(member)
	if ok {
		t.Errorf("%s: ready (%s), want not ready", when, why)
		return
	}
	for _, w := range says {
		if !strings.Contains(why, w) {
			t.Errorf("%s: readiness says %q, want it to say %q", when, why, w)
		}
	}
}

// TestReadinessFollowsProgress: records waiting with none finished for the
// grace is not ready, and the message says how many and for how long; a
// finished record makes the member ready again at once. In virtual time.
func TestReadinessFollowsProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w fakeWork
		s := startWatch(t, 15*time.Second, &w)
		wait(time.Minute)
		wantReady(t, s, "idle for a minute")

		w.held.Store(1200)
		wait(14 * time.Second)
		wantReady(t, s, "1200 records held for 14s (within the grace)")
		wait(3 * time.Second)
		wantNotReady(t, s, "1200 records held, none finished for 17s", "1200 records waiting (held by this member), none finished for 17s", "(none since the start)")

		s.OnRecordDone(nil, 1, 0)
		wait(time.Second)
		wantReady(t, s, "a record finished")

		// Steady progress while records wait: ready all along.
		for i := range 40 {
			s.OnRecordDone(nil, 1, 0)
			wait(time.Second)
			if i%10 == 9 {
				wantReady(t, s, fmt.Sprintf("a record a second for %ds", i+1))
			}
		}
		wait(16 * time.Second)
		wantNotReady(t, s, "records held, none finished for 16s after the last", "none finished for 16s")
		if _, why := s.ready(member); strings.Contains(why, "since the start") {
			t.Errorf("readiness says %q after records finished", why)
		}

		// Nothing waiting resets the clock: work arriving after a quiet
		// spell gets the whole grace.
		w.held.Store(0)
		wait(time.Minute)
		wantReady(t, s, "drained")
		w.held.Store(3)
		wait(5 * time.Second)
		wantReady(t, s, "3 records held for 5s after an idle minute")
	})
}

// TestReadinessSeesLagAfterABrokerRestart: with nothing held in memory
// (a restarted broker lost the fetch positions and the group has not
// fetched again), lag on the assigned partitions is work waiting (issue 28:
// ready 3.8s after the restart, though the first record arrived at 25s).
func TestReadinessSeesLagAfterABrokerRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w fakeWork
		s := startWatch(t, 15*time.Second, &w)
		wait(10 * time.Second)
		w.lag.Store(40)
		wait(10 * time.Second) // the lag is listed every 5s
		wantReady(t, s, "lag for at most 10s")
		wait(10 * time.Second)
		wantNotReady(t, s, "lag, nothing fetched for 15s or more", "40 records waiting (not fetched yet)")

		// The group fetches and finishes records again.
		w.lag.Store(0)
		w.held.Store(40)
		s.OnRecordDone(nil, 1, 0)
		wait(time.Second)
		wantReady(t, s, "records finishing again")
	})
}

// TestReadinessNamesTheStall: the message quotes the last attempt error
// and the last dead-letter write failure since the last progress (issue
// 28: ready while every dead-letter write failed with MESSAGE_TOO_LARGE,
// and while every request failed TLS verification).
func TestReadinessNamesTheStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w fakeWork
		s := startWatch(t, 15*time.Second, &w)
		s.OnAttemptFailed(nil, 1, errors.New("old failure, before the last progress"), 0)
		wait(time.Second)
		s.OnRecordDone(nil, 1, 0)
		wait(time.Second)

		w.held.Store(1)
		tls := errors.New(`Post "https://127.0.0.1:8443/": tls: failed to verify certificate: x509: certificate signed by unknown authority`)
		s.OnAttemptFailed(nil, 7, tls, time.Second)
		s.OnDeadLetterFailed(1, fmt.Errorf("deadletter: producing 1 dead letters: %w", kerr.MessageTooLarge))
		wait(20 * time.Second)
		wantNotReady(t, s, "every request failing TLS verification, the dead letter refused",
			"1 record waiting", "last error: Post \"https://127.0.0.1:8443/\": tls: failed to verify certificate",
			"last dead-letter write failed: deadletter: producing 1 dead letters: MESSAGE_TOO_LARGE")
		if _, why := s.ready(member); strings.Contains(why, "old failure") {
			t.Errorf("readiness quotes an error from before the last progress: %q", why)
		}
	})
}

// TestReadinessCountsCommitsAndShareRecords: a commit that moves an offset
// is progress, one that repeats the offsets is not; a share-group member's
// acquired records are work waiting; a member that is not in its group
// says so whatever its progress.
func TestReadinessCountsCommitsAndShareRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w fakeWork
		w.share.Store(true)
		w.held.Store(5)
		s := startWatch(t, 15*time.Second, &w)
		offsets := map[string]map[int32]int64{"t": {0: 10}}
		s.OnCommit(offsets, nil)
		wait(10 * time.Second)
		s.OnCommit(map[string]map[int32]int64{"t": {0: 12}}, nil)
		wait(10 * time.Second)
		wantReady(t, s, "a commit moved 10s ago")
		s.OnCommit(map[string]map[int32]int64{"t": {0: 12}}, nil) // the same offsets
		s.OnCommit(map[string]map[int32]int64{"t": {0: 14}}, errors.New("commit failed"))
		wait(6 * time.Second)
		wantNotReady(t, s, "5 share records acquired, no commit moved for 16s", "5 records waiting (held by this member)")

		if ok, why := s.ready(func() (bool, string) { return false, "joining group g" }); ok || why != "joining group g" {
			t.Errorf("not a member: ready() = %v %q, want the membership's answer", ok, why)
		}
	})
}

func TestReadyStallFlag(t *testing.T) {
	var unset stallFlag
	if g := unset.grace(10 * time.Second); g != 15*time.Second {
		t.Errorf("default grace with the default 10s attempt timeout = %v, want 15s", g)
	}
	if g := unset.grace(time.Minute); g != 65*time.Second {
		t.Errorf("default grace with a 1m attempt timeout = %v, want 1m5s", g)
	}
	var f stallFlag
	for _, bad := range []string{"0s", "-1s", "soon"} {
		if err := f.Set(bad); err == nil {
			t.Errorf("--ready-stall %s accepted", bad)
		}
	}
	if err := f.Set("2m"); err != nil || f.grace(time.Hour) != 2*time.Minute {
		t.Errorf("--ready-stall 2m: %v, grace %v", err, f.grace(time.Hour))
	}
	// Through the command line, bad values are usage errors naming the flag.
	for _, args := range [][]string{{"--ready-stall", "0s"}, {"--ready-stall", "x"}} {
		var out, errb strings.Builder
		code := cmdForward(context.Background(), append([]string{"--brokers", "127.0.0.1:1", "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:1/"}, args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "--ready-stall") {
			t.Errorf("kpar forward %v: exit %d, stderr %q; want 2 naming --ready-stall", args, code, errb.String())
		}
	}
}

// failingSink refuses every dead letter until fixed, as a topic too small
// for them would.
type failingSink struct{ fixed atomic.Bool }

func (s *failingSink) Write(context.Context, []deadletter.Letter) error {
	if s.fixed.Load() {
		return nil
	}
	return fmt.Errorf("deadletter: producing 1 dead letters: %w (uncompressed_bytes=5243184)", kerr.MessageTooLarge)
}

// TestReadyzWhileDeadLettersFail: end to end on kfake, a member whose
// dead-letter writes all fail stops finishing records and committing, and
// /readyz turns 503 after the grace, naming the sink's error; once the sink
// takes the letters, it is ready again.
func TestReadyzWhileDeadLettersFail(t *testing.T) {
	stall := newStallWatch(2 * time.Second)
	sink := new(failingSink)
	f := newReadyFixture(t, stall, 1, 20, func(_ context.Context, r *kgo.Record) error {
		if r.Offset == 3 {
			return kpar.Permanent(errors.New("422 Unprocessable Entity"))
		}
		return nil
	}, kpar.DeadLetters(sink), kpar.RetryBackoff(10*time.Millisecond, 100*time.Millisecond))
	f.run(t)
	// Records after offset 3 finish, and the window start stays on 3: the
	// commits stop moving. More records arrive and wait behind it.
	testkit.Produce(t, f.cluster.ListenAddrs(), &kgo.Record{Topic: "t", Value: []byte("more")})
	f.waitFor(t, "/readyz to answer 503", func() bool { code, _ := f.get(t, "/readyz"); return code == http.StatusServiceUnavailable })
	_, body := f.get(t, "/readyz")
	for _, want := range []string{"not ready: ", "1 record waiting (held by this member), none finished for ", "last dead-letter write failed: deadletter: producing 1 dead letters: MESSAGE_TOO_LARGE"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz body %q lacks %q", body, want)
		}
	}
	if s := f.apiStatus(t); s.Ready || s.Readiness != strings.TrimSuffix(strings.TrimPrefix(body, "not ready: "), "\n") {
		t.Errorf("/api/status readiness %v %q disagrees with /readyz %q", s.Ready, s.Readiness, body)
	}
	t.Logf("GET /readyz: %s", strings.TrimSpace(body))

	sink.fixed.Store(true)
	f.waitFor(t, "/readyz to answer 200 once the sink takes the letter", func() bool { code, _ := f.get(t, "/readyz"); return code == http.StatusOK })
}

// TestStallWatchListsLag: the lag of the assigned partitions is the end
// offsets minus the group's committed offsets, from the start offset where
// nothing is committed, listed through the Consumer's own client.
func TestStallWatchListsLag(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	c := testkit.Cluster(t, kfake.SeedTopics(2, "t"))
	s := newStallWatch(time.Minute)
	if s.list(ctx, []kpar.PartitionStats{{Topic: "t", Partition: 0}}).lagKnown {
		t.Error("lag known before the Consumer has a client")
	}
	cl := lagGroup(ctx, t, c, s, 2, 10, kadm.OffsetsFromRecords(kgo.Record{Topic: "t", Partition: 0, Offset: 2}))
	// Partition 0: 5 records, committed at 3; partition 1: 5, none committed.
	l := s.list(ctx, []kpar.PartitionStats{{Topic: "t", Partition: 0}, {Topic: "t", Partition: 1}})
	if !l.lagKnown || l.lag != 2+5 {
		t.Errorf("lag = %d, %v; want 7", l.lag, l.lagKnown)
	}
	stallClient{s}.OnClientClosed(cl)
	if s.list(ctx, []kpar.PartitionStats{{Topic: "t", Partition: 0}}).lagKnown {
		t.Error("lag known after the Consumer's client closed")
	}
}
