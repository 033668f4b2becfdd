package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/internal/testkit"
	"github.com/kpar/kpar/kparprom"
)

// shareEndpoint answers the two members of TestForwardShareGroupSIGKILL:
// it records, per member (its X-Member request header), which records
// reached it, and answers 400 to the poison records.
type shareEndpoint struct {
	srv    *httptest.Server
	poison func(i int) bool

	changes                        // mu guards the fields below
	seen    map[int]int            // requests per record index
	ok      map[int]int            // 2xx answers per index
	members map[string]map[int]int // member -> index -> requests
	bFirst  chan struct{}          // closed at member b's first request
}

func newShareEndpoint(t *testing.T, poison func(int) bool) *shareEndpoint {
	e := &shareEndpoint{poison: poison, seen: map[int]int{}, ok: map[int]int{},
		members: map[string]map[int]int{}, bFirst: make(chan struct{})}
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *shareEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	i, err := strconv.Atoi(string(body))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	m := r.Header.Get("X-Member")
	e.mu.Lock()
	if e.members[m] == nil {
		e.members[m] = map[int]int{}
		if m == "b" {
			close(e.bFirst)
		}
	}
	e.members[m][i]++
	e.seen[i]++
	e.mu.Unlock()
	// Member a holds its requests until b has one, so that a alone cannot
	// drain the topic before b joins; b answers slowly, so it has
	// requests in flight when it is killed.
	delay := 2 * time.Millisecond
	if m == "a" {
		select {
		case <-e.bFirst:
		case <-r.Context().Done():
			return
		}
	} else {
		delay = 15 * time.Millisecond
	}
	select {
	case <-time.After(delay):
	case <-r.Context().Done():
		return
	}
	status := http.StatusOK
	if e.poison(i) {
		status = http.StatusBadRequest
	}
	e.mu.Lock()
	if status == http.StatusOK {
		e.ok[i]++
	}
	e.changedLocked()
	e.mu.Unlock()
	w.WriteHeader(status)
}

func (e *shareEndpoint) waitFor(ctx context.Context, t *testing.T, ps []*process, what string, cond func() bool) {
	t.Helper()
	if e.await(ctx, nil, cond) {
		return
	}
	var tails []string
	for _, p := range ps {
		tails = append(tails, tail(p.stderr))
	}
	t.Fatalf("waiting for %s: %v; kpar forward stderr:\n%s", what, ctx.Err(), strings.Join(tails, "\n----\n"))
}

// TestForwardShareGroupSIGKILLLosesNothing: two `kpar forward --share-group`
// processes on a topic with one partition both get records; one is
// SIGKILLed mid-run; every record still reaches the endpoint, and the
// records it answers 400 are in the dead-letter topic with kpar's headers.
func TestForwardShareGroupSIGKILLLosesNothing(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1", "--share-lock-duration", "1s")

	const topic, n, keys = "shared", 400, 40
	poison := func(i int) bool { return i%50 == 7 }
	produceIndexed(ctx, t, topic, n, keys, kgo.SeedBrokers(addr))
	ep := newShareEndpoint(t, poison)
	args := func(member string) []string {
		return []string{"--brokers", addr, "--share-group", "sg", "--topic", topic, "--url", ep.srv.URL,
			"--concurrency", "8", "--header", "X-Member: " + member, "--shutdown-timeout", "5s"}
	}
	a := startForward(ctx, t, bin, nil, args("a")...)
	// The environment variable works as the flag does.
	b := startForward(ctx, t, bin, []string{"KPAR_SHARE_GROUP=sg"}, slices.Delete(args("b"), 2, 4)...)
	both := []*process{a, b}

	ep.waitFor(ctx, t, both, "member b to deliver 30 records", func() bool { return len(ep.members["b"]) >= 30 })
	if code := b.stop(ctx, t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit code %d after SIGKILL, want death by signal", code)
	}
	ep.waitFor(ctx, t, []*process{a}, "every record to reach the endpoint", func() bool {
		for i := range n {
			if (poison(i) && ep.seen[i] == 0) || (!poison(i) && ep.ok[i] == 0) {
				return false
			}
		}
		return true
	})

	// The dead letters: every poison record, with kpar's headers naming the
	// share group (a record b dead-lettered just before the kill may be
	// there twice).
	cl := newClient(t, addr, kgo.ConsumeTopics(topic+".dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	letters := map[int]bool{}
	var want int
	for i := range n {
		if poison(i) {
			want++
		}
	}
	for len(letters) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("dead letters: %d of %d: %v; a's stderr:\n%s", len(letters), want, ctx.Err(), tail(a.stderr))
		}
		fs.EachRecord(func(r *kgo.Record) {
			i, _ := strconv.Atoi(string(r.Value))
			if !poison(i) {
				t.Errorf("record %d is in the dead letters but the endpoint accepted it", i)
			}
			for k, v := range map[string]string{
				deadletter.HeaderTopic: topic, deadletter.HeaderPartition: "0",
				deadletter.HeaderGroup: "sg", deadletter.HeaderClass: string(deadletter.ClassPermanent),
			} {
				if got := headerValue(r, k); got != v {
					t.Errorf("dead letter of record %d: header %s = %q, want %q", i, k, got, v)
				}
			}
			letters[i] = true
		})
	}
	if code := a.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(a.stderr))
	}
	if !strings.Contains(a.stderr.String(), "acknowledged") {
		t.Errorf("member a's last log line does not report its acknowledgements:\n%s", tail(a.stderr))
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	t.Logf("member a got %d records, b %d (killed); %d records requested more than once",
		len(ep.members["a"]), len(ep.members["b"]), countAbove(ep.seen, 1))
	if len(ep.members["a"]) == 0 || len(ep.members["b"]) == 0 {
		t.Errorf("records per member: a %d, b %d: want both above 0", len(ep.members["a"]), len(ep.members["b"]))
	}
}

func countAbove(m map[int]int, n int) int {
	c := 0
	for _, v := range m {
		if v > n {
			c++
		}
	}
	return c
}

// TestForwardShareGroupFlagsAreExclusive: --share-group excludes --group
// and the options a share group cannot keep, each with a usage error.
func TestForwardShareGroupFlagsAreExclusive(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, time.Minute)
	base := []string{"--brokers", "127.0.0.1:1", "--topic", "t", "--url", "http://127.0.0.1:1/", "--share-group", "sg"}
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--group", "g"}, "both --group and --share-group given"},
		{[]string{"--ordering", "partition"}, "--ordering key"},
		{[]string{"--instance-id", "i"}, "no static membership"},
		{[]string{"--retry-topics", "1s"}, "--retry-topics is not supported with --share-group"},
		{[]string{"--commit-budget", "10"}, "--commit-budget is not supported with --share-group"},
		{[]string{"--commit-interval", "10ms"}, "--commit-interval is not supported with --share-group"},
		{[]string{"--group-protocol", "consumer"}, "--group-protocol consumer is not supported with --share-group"},
		{[]string{"--exactly-once"}, "--exactly-once is not supported with --share-group"},
	} {
		t.Run(strings.TrimPrefix(tc.extra[0], "--"), func(t *testing.T) {
			p := startForward(ctx, t, bin, nil, append(slices.Clone(base), tc.extra...)...)
			if code := p.wait(ctx, t); code != 2 {
				t.Fatalf("exit code %d, want 2 (usage); stderr:\n%s", code, p.stderr)
			}
			if !strings.Contains(p.stderr.String(), tc.want) {
				t.Fatalf("stderr does not say %q:\n%s", tc.want, p.stderr)
			}
		})
	}
	p := startForward(ctx, t, bin, nil, "--brokers", "127.0.0.1:1", "--topic", "t", "--url", "http://127.0.0.1:1/")
	if code := p.wait(ctx, t); code != 2 || !strings.Contains(p.stderr.String(), "--share-group") {
		t.Fatalf("no group: exit %d, stderr:\n%s\nwant 2 and a message naming --group and --share-group", code, p.stderr)
	}
}

// TestServeStatusOfAShareGroupMember: /readyz, /api/status and /metrics of a
// share-group member, which has no partitions to show.
func TestServeStatusOfAShareGroupMember(t *testing.T) {
	const records = 30
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	cluster := testkit.Cluster(t, kfake.SeedTopics(1, "t"))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	produceIndexed(ctx, t, "t", records, 3, kgo.SeedBrokers(cluster.ListenAddrs()...))

	m := kparprom.New()
	cons, err := kpar.New(kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		kpar.Brokers(cluster.ListenAddrs()...), kpar.ShareGroup("sg"), kpar.Topics("t"), kpar.WithHooks(m),
		kpar.ClientOptions(kgo.FetchMaxWait(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	f := serveFixture(t, cluster, cons, m)

	if code, body := f.get(t, "/readyz"); code != http.StatusServiceUnavailable || body != "not ready: share group sg: consumer not running\n" {
		t.Errorf("GET /readyz before Run = %d %q", code, body)
	}
	rctx, stopRun := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(rctx) }()
	f.waitFor(t, "every record accepted", func() bool {
		s := f.apiStatus(t)
		return s.Share != nil && s.Share.Accepted == records
	})
	if code, body := f.get(t, "/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "ready: share group sg: ") {
		t.Errorf("GET /readyz = %d %q, want 200 naming the share group", code, body)
	}
	s := f.apiStatus(t)
	if !s.Ready || len(s.Partitions) != 0 || s.Share.Group != "sg" || s.Share.Received != records || s.Share.Acquired != 0 || s.Share.DeliveryLimit != 5 {
		t.Errorf("GET /api/status = %+v, share %+v", s, s.Share)
	}
	_, body := f.get(t, "/metrics")
	for _, want := range []string{
		`kpar_share_received_records_total 30`,
		`kpar_share_acknowledgements_total{kind="accept"} 30`,
		`kpar_share_acquired_records 0`,
		`kpar_records_handled_total{topic="t"} 30`,
		`kpar_ready 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}
	if _, page := f.get(t, "/"); !strings.Contains(page, `<tbody id="share-stats">`) {
		t.Error("the status page has no share panel")
	}
	stopRun()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
