package main

import (
	"context"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// TestForwardExplainsAShareWaitForADeadMember: restarted after kill -9, a
// share-group member gets the partitions the broker moves to it, while
// those of the dead member, and their records, wait for its share session
// (issue 35: 45 s of silence, /readyz 503, after a kill -9 in the fault
// matrix). The log says so once nothing came for a while: which group, how
// many records wait, the broker's bounds (kpar broker
// --share-session-timeout 25s here, not the default 45s) and what shortens
// the wait; then that records came again, sooner than the default session.
func TestForwardExplainsAShareWaitForADeadMember(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	const session = 25 * time.Second
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2", "--share-session-timeout", session.String())
	produceIndexed(ctx, t, "sw", 10, 10, kgo.SeedBrokers(addr))
	ep := newEndpoint(t, func(int, int) reply { return reply{} })
	args := []string{"--brokers", addr, "--share-group", "sw-g", "--topic", "sw", "--url", ep.srv.URL}
	p := startForward(ctx, t, bin, nil, args...)
	ep.waitFor(ctx, t, p, "the first records delivered", func() bool { return ep.delivered() == 10 })
	if code := p.stop(ctx, t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit code %d after SIGKILL, want death by signal", code)
	}
	// Records on both partitions: those of the dead member's wait.
	cl := newClient(t, addr, kgo.DefaultProduceTopic("sw"))
	for i := 10; i < 30; i++ {
		r := &kgo.Record{Key: []byte("k" + strconv.Itoa(i)), Value: []byte(strconv.Itoa(i)), Headers: []kgo.RecordHeader{{Key: "source", Value: []byte("e2e")}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cl.Close()

	p = startForward(ctx, t, bin, nil, args...)
	if !p.stderr.wait(ctx, "share group records delivered again", p.exited) {
		t.Fatalf("no line saying records came again; stderr:\n%s", tail(p.stderr))
	}
	ep.waitFor(ctx, t, p, "every record delivered", func() bool { return ep.delivered() == 30 })
	log := p.stderr.String()
	note, again := strings.Index(log, "no records delivered while the share group has records waiting"), strings.Index(log, "share group records delivered again")
	if note < 0 || note > again {
		t.Fatalf("no note on the wait before records came again; stderr:\n%s", tail(p.stderr))
	}
	line, _, _ := strings.Cut(log[note:], "\n")
	for _, want := range []string{"share_group=sw-g", "waiting_records=", "a member that stopped without leaving", "group.share.session.timeout.ms, " + session.String() + " on this broker",
		"kpar broker --share-session-timeout", "SIGTERM", "members="} {
		if !strings.Contains(line, want) {
			t.Errorf("the note lacks %q: %s", want, line)
		}
	}
	line, _, _ = strings.Cut(log[again:], "\n")
	m := regexp.MustCompile(`waited=(\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("the line does not say how long it waited: %s", line)
	}
	// The wait ends with the session: well before the default 45s.
	if waited, err := time.ParseDuration(m[1]); err != nil || waited >= 40*time.Second {
		t.Errorf("waited %s (%v) with --share-session-timeout %v, want less than 40s", m[1], err, session)
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
}

// TestBrokerShareSessionFlags: --share-session-timeout and
// --share-heartbeat-interval become the broker configs kfake reads, 45s
// and 1s unless given; out-of-range values are refused with why.
func TestBrokerShareSessionFlags(t *testing.T) {
	for _, tc := range []struct {
		args               []string
		session, heartbeat string // the configs; "" for a refusal
		refusal            string
	}{
		{nil, "45000", "1000", ""},
		{[]string{"--share-session-timeout", "5s", "--share-heartbeat-interval", "200ms"}, "5000", "200", ""},
		{[]string{"--share-session-timeout", "500ms"}, "", "", "invalid --share-session-timeout 500ms: want 1s to 30m"},
		{[]string{"--share-session-timeout", "2s", "--share-heartbeat-interval", "2s"}, "", "", "invalid --share-heartbeat-interval 2s: want 100ms or more, below --share-session-timeout (2s)"},
	} {
		var stderr strings.Builder
		b, code, ok := parseBroker(tc.args, &stderr)
		if tc.refusal != "" {
			if ok || code != 2 || !strings.Contains(stderr.String(), tc.refusal) {
				t.Errorf("%q: ok %v, exit code %d, stderr %q; want 2 and %q", tc.args, ok, code, stderr.String(), tc.refusal)
			}
			continue
		}
		if !ok {
			t.Fatalf("%q refused: %s", tc.args, stderr.String())
		}
		m := b.share.configs(map[string]string{})
		if m["group.share.session.timeout.ms"] != tc.session || m["group.share.heartbeat.interval.ms"] != tc.heartbeat {
			t.Errorf("%q: configs %v, want session %s ms, heartbeat %s ms", tc.args, m, tc.session, tc.heartbeat)
		}
	}
}

// TestShareWaitSpeaksOnlyWhileRecordsWaitForNobody, in virtual time: a
// member that receives nothing while the group's records wait, untaken, is
// told why at joinNote and again every joinReport, and that records came
// again when they do; while other members take the waiting records (fewer
// at each look), or none wait, it says nothing.
func TestShareWaitSpeaksOnlyWhileRecordsWaitForNobody(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting func(look int) int64 // the group's backlog at the look-th look (from 0)
		want    []string
	}{
		{"records held by a dead member", func(int) int64 { return 10 }, []string{
			"WARN kpar forward: no records delivered while the share group has records waiting: it is likely waiting for a member that stopped without leaving (kill -9, a crash, an OOM kill), whose share partitions stay assigned to it until its share session expires, and the records it acquired locked until then or until their locks expire; or other members hold every record",
			"WARN kpar forward: still no records delivered while the share group has records waiting", // at 23s
			"WARN kpar forward: still no records delivered while the share group has records waiting", // at 38s
			"INFO kpar forward: share group records delivered again",                                  // at 45s
		}},
		{"records other members take", func(look int) int64 { return int64(1000 - look) }, nil},
		{"records held, then taken by other members", func(look int) int64 { return map[bool]int64{true: 10, false: 5}[look < 3] }, []string{
			"WARN kpar forward: no records delivered while the share group has records waiting: it is likely waiting for a member that stopped without leaving (kill -9, a crash, an OOM kill), whose share partitions stay assigned to it until its share session expires, and the records it acquired locked until then or until their locks expire; or other members hold every record",
			"WARN kpar forward: still no records delivered while the share group has records waiting", // at 24s
			"INFO kpar forward: the share group's waiting records go to other members now",            // at 39s
		}},
		{"no records waiting", func(int) int64 { return 0 }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				logs := &lineLog{}
				var received atomic.Int64
				looks := 0
				s := &shareWait{w: newBrokerWatch(slog.New(logs), "kpar forward"), group: "sg",
					stats: func() (kpar.ShareStats, bool) { return kpar.ShareStats{Received: received.Load()}, true },
					backlog: func(context.Context) (shareBacklog, bool) {
						looks++
						return shareBacklog{waiting: tc.waiting(looks - 1)}, true
					}}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan struct{})
				go func() { defer close(done); s.run(ctx) }()
				time.Sleep(45*time.Second + time.Millisecond) // the first sample at 1s starts the wait
				received.Store(1)
				time.Sleep(time.Second)
				cancel()
				<-done
				if got := logs.lines(); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
				}
			})
		})
	}
}
