package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/internal/ledger"
	"github.com/kpar/kpar/internal/testkit"
)

// TestChaosRebalanceStorm runs three `kpar forward` members of one group
// and, every 2 seconds, makes one leave (by SIGTERM and SIGKILL in turn) or
// a new one join, while records are produced all along and the endpoint
// takes 0-10 ms per record; in both group protocols. Nothing may be lost,
// per-key order must hold across every hand-over, and the duplicates stay
// within what the SIGKILLs can cost: the records in flight in the killed
// member plus what finished within one commit spacing (a graceful leave or
// join re-delivers nothing that finished), and in the classic protocol the
// stall of a rebalance that waits for a killed member. In the consumer
// protocol, which has no such barrier, the group never goes a session
// timeout without committing (the commits are read from the broker).
//
// The default is short for CI (10 s of storm); KPAR_CHAOS_SOAK=1 storms
// for 60 s, as the issue asks.
func TestChaosRebalanceStorm(t *testing.T) {
	t.Parallel()
	inEachProtocol(t, rebalanceStorm)
}

func rebalanceStorm(t *testing.T, proto kpar.Protocol) {
	storm, perSecond := 10*time.Second, 500
	if os.Getenv("KPAR_CHAOS_SOAK") != "" {
		storm = 60 * time.Second
	}
	const every, members, concurrency, keys = 2 * time.Second, 3, 16, 200
	// A member SIGKILLed while a rebalance waits for it to rejoin holds the
	// group for the rebalance timeout (the classic protocol): commits fail
	// meanwhile, and what was handled on partitions that then move is
	// delivered again. 15s keeps that stall short.
	const rebalanceTimeout = 15 * time.Second
	bin := buildKpar(t)
	ctx, cancel := context.WithTimeout(t.Context(), storm+2*time.Minute)
	defer cancel()
	cc := newChaosCluster(ctx, t, bin, 6, "storm")
	addr, topic, group := cc.addr, cc.name("storm"), cc.name("storm")

	l := ledger.New(ledger.ByKey, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	ep := newLedgerEndpoint(t, l, topic, func(int, int) (int, time.Duration) {
		return http.StatusOK, time.Duration(rand.IntN(11)) * time.Millisecond
	})
	args := []string{"--brokers", addr, "--group", group, "--topic", topic, "--url", ep.srv.URL,
		"--concurrency", strconv.Itoa(concurrency), "--ordering", "key", "--retry-backoff", "5ms",
		"--rebalance-timeout", rebalanceTimeout.String(), "--shutdown-timeout", "10s", "--log-level", chaosLogLevel()}
	// The broker's least session timeout (classic): a SIGKILLed member's
	// partitions go to the others 6 s later, in both protocols.
	const sessionTimeout = 6 * time.Second
	args = append(args, setGroupTimeouts(ctx, t, addr, group, proto, sessionTimeout)...)

	prod := startChaosProducer(ctx, t, addr, topic, perSecond, keys, l)
	w := watchCommits(ctx, t, addr, group, topic, handlings(l))
	var running, all []*process
	start := func() {
		p := startMember(ctx, t, bin, args...)
		running, all = append(running, p), append(all, p)
	}
	for range members {
		start()
	}
	var events []string
	kills, terms, joins := 0, 0, 0
	leaveByKill := false
	tick := time.NewTicker(every)
	defer tick.Stop()
	for end := time.Now().Add(storm); time.Now().Before(end); {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("storm: %v", ctx.Err())
		}
		for _, p := range running {
			select {
			case <-p.exited:
				t.Fatalf("a member exited by itself (%v); stderr:\n%s", p.waitErr, tail(p.stderr))
			default:
			}
		}
		if len(running) < members {
			start()
			joins++
			events = append(events, fmt.Sprintf("%v join", w.since()))
			continue
		}
		i := rng.IntN(len(running))
		p := running[i]
		running = append(running[:i], running[i+1:]...)
		if leaveByKill {
			inFlight := ep.active.Load() // all members': an upper bound of the killed one's
			began := time.Now()
			if code := p.stop(ctx, t, syscall.SIGKILL); code != -1 {
				t.Fatalf("exit code %d after SIGKILL, want death by signal", code)
			}
			kills++
			events = append(events, fmt.Sprintf("%v kill(%d in flight, %v)", w.since(), inFlight, time.Since(began).Round(time.Millisecond)))
		} else {
			began := time.Now()
			if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
				t.Fatalf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
			}
			terms++
			events = append(events, fmt.Sprintf("%v term(%v)", w.since(), time.Since(began).Round(time.Millisecond)))
		}
		leaveByKill = !leaveByKill
	}
	produced := prod.Stop(t)
	waitReached(t, l, produced, time.Minute, "every record after the storm")
	for _, p := range running {
		if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
		}
	}
	checkCommittedAtEnd(ctx, t, addr, group, topic)
	commits := w.result(t)

	rep := l.Report()
	t.Logf("storm of %v, events %v: %d records produced at %d/s, %d SIGKILLs, %d SIGTERMs, %d joins; %+v; longest commit gap %v, gaps of 1s or more %s",
		storm, events, produced, perSecond, kills, terms, joins, rep, commits.Longest, gapsString(commits.Gaps))
	if bad := ep.malformed(); len(bad) > 0 {
		t.Errorf("malformed requests: %q", bad)
	}
	// Each SIGKILL repeats at most the killed member's requests in flight
	// plus what finished within one commit spacing and its round trip:
	// 4 x concurrency, as in TestChaosKillLoop; and in the classic
	// protocol, when it lands in a rebalance, what the group consumed
	// during the stall (production rate x rebalance timeout). Leaves and
	// joins add nothing.
	perKill := int64(4 * concurrency)
	if proto == kpar.ClassicProtocol {
		perKill += int64(perSecond) * int64(rebalanceTimeout/time.Second)
	}
	bound := int64(kills) * perKill
	if err := rep.Check(bound); err != nil {
		for i, p := range all {
			t.Logf("member %d's stderr:\n%s", i+1, tail(p.stderr))
		}
		t.Error(err)
	}
	// The consumer protocol has no group-wide barrier: a SIGKILLed member
	// holds its own partitions until its session expires, and the others'
	// commits go on meanwhile, as production does on every partition.
	if proto == kpar.ConsumerProtocol && commits.Longest.Len() >= sessionTimeout {
		t.Errorf("the group went %v without committing, the session timeout or more: a barrier?", commits.Longest)
	}
}

// startChaosProducer produces perSecond records a second to topic (keys
// "k<i mod keys>") until stopped, noting each in l, and returns once the
// first is acknowledged: the topic exists.
func startChaosProducer(ctx context.Context, t *testing.T, addr, topic string, perSecond, keys int, l *ledger.Ledger) *testkit.Producer {
	t.Helper()
	prod := testkit.StartProducer(ctx, t, strings.Split(addr, ","), topic, perSecond, keys, l.Produced)
	select {
	case <-prod.Started:
	case <-ctx.Done():
		t.Fatalf("nothing produced: %v", ctx.Err())
	}
	return prod
}
