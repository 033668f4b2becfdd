package kparprom_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/kparprom"
)

func TestMetricsCountRecordsAttemptsAndLatency(t *testing.T) {
	const topic, n = "t", 40
	cluster := newCluster(t, topic, 4)
	produce(t, cluster, topic, n, 8)

	m := kparprom.New()
	var (
		mu   sync.Mutex
		seen = map[int64]bool{} // partition<<32|offset tried before
	)
	cons := newConsumer(t, cluster, m, "g", topic, func(_ context.Context, r *kgo.Record) error {
		mu.Lock()
		first := !seen[int64(r.Partition)<<32|r.Offset]
		seen[int64(r.Partition)<<32|r.Offset] = true
		mu.Unlock()
		switch {
		case !first:
			return nil
		case r.Partition == 0 && r.Offset == 0:
			panic("boom")
		case r.Offset%4 == 1:
			return errors.New("try again")
		}
		return nil
	})
	stop := run(t, cons)
	eventually(t, 20*time.Second, "every record handled", func() bool { return m.Totals().Handled >= n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	reg := m.Registry()
	tot := m.Totals()
	if tot.Handled != n || tot.Failed == 0 || tot.Retried != tot.Failed {
		t.Fatalf("Totals() = %+v, want %d handled and as many retries as failures (> 0)", tot, n)
	}
	checks := []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"kpar_records_handled_total", map[string]string{"topic": topic}, n},
		{"kpar_attempts_total", map[string]string{"topic": topic}, float64(n + tot.Retried)},
		{"kpar_records_retried_total", map[string]string{"topic": topic}, float64(tot.Retried)},
		{"kpar_attempts_failed_total", map[string]string{"topic": topic}, float64(tot.Failed)},
		{"kpar_attempts_failed_total", map[string]string{"topic": topic, "class": "panic"}, 1},
		{"kpar_attempts_failed_total", map[string]string{"topic": topic, "class": "error"}, float64(tot.Failed - 1)},
		{"kpar_handler_latency_seconds", map[string]string{"topic": topic}, n}, // sample count
		{"kpar_partitions_assigned_total", map[string]string{"topic": topic}, 4},
	}
	for _, c := range checks {
		if got := sum(t, reg, c.name, c.match); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.match, got, c.want)
		}
	}
	if got := sum(t, reg, "kpar_commits_total", nil); got < 1 {
		t.Errorf("kpar_commits_total = %v, want at least 1", got)
	}
	if got := sum(t, reg, "kpar_commit_errors_total", nil); got != 0 {
		t.Errorf("kpar_commit_errors_total = %v, want 0", got)
	}
	if got := sum(t, reg, "kpar_ready", nil); got != 0 {
		t.Errorf("kpar_ready after Run returned = %v, want 0", got)
	}
}

func TestMetricsIncludeTheClientsOwnMetrics(t *testing.T) {
	const topic = "t"
	cluster := newCluster(t, topic, 2)
	produce(t, cluster, topic, 10, 2)
	m := kparprom.New()
	cons := newConsumer(t, cluster, m, "g", topic, func(context.Context, *kgo.Record) error { return nil })
	run(t, cons)
	eventually(t, 20*time.Second, "records handled", func() bool { return m.Totals().Handled >= 10 })

	if got := sum(t, m.Registry(), "kpar_client_connects_total", nil); got < 1 {
		t.Errorf("kpar_client_connects_total = %v, want at least 1 (kprom wired through ClientOpts)", got)
	}
	if got := sum(t, m.Registry(), "kpar_client_fetch_bytes_total", map[string]string{"topic": topic}); got <= 0 {
		t.Errorf("kpar_client_fetch_bytes_total{topic=%q} = %v, want > 0", topic, got)
	}
}

func TestPartitionCollectorReportsWindowsAndLag(t *testing.T) {
	const topic, n = "t", 40
	cluster := newCluster(t, topic, 4)
	produce(t, cluster, topic, n, n) // a key per record: all may run at once

	m := kparprom.New()
	held := newGate()
	cons := newConsumer(t, cluster, m, "g", topic, func(ctx context.Context, _ *kgo.Record) error { return held.wait(ctx) })
	pc := m.PartitionCollector(cons.Partitions)
	g := collectorGatherer(t, pc)
	run(t, cons)

	// Every record is fetched and in a handler; kpar committed each
	// partition's window start (its first offset), so the lag is the whole
	// partition.
	eventually(t, 20*time.Second, "all records in flight and the window starts committed", func() bool {
		return sum(t, g, "kpar_partition_in_flight", nil) == n &&
			sum(t, g, "kpar_partition_commit_lag", nil) == n &&
			len(gather(t, g, "kpar_partition_commit_lag")) == 4
	})
	if got := testutil.CollectAndCount(pc, "kpar_partition_window_records"); got != 4 {
		t.Errorf("kpar_partition_window_records has %d series, want one per partition (4)", got)
	}
	for name, want := range map[string]float64{
		"kpar_partitions_assigned":        4,
		"kpar_partition_window_records":   n,
		"kpar_partition_window_finished":  0,
		"kpar_partition_high_watermark":   n,
		"kpar_partition_window_end":       n,
		"kpar_partition_window_start":     0,
		"kpar_partition_committed_offset": 0,
		"kpar_partition_paused":           0,
		"kpar_partition_commit_lag":       n,
		"kpar_partition_in_flight":        n,
	} {
		if got := sum(t, g, name, nil); got != want {
			t.Errorf("sum of %s = %v, want %v", name, got, want)
		}
	}
	st := m.PartitionStatus(context.Background(), cons.Partitions())
	if len(st) != 4 {
		t.Fatalf("PartitionStatus returned %d partitions, want 4", len(st))
	}
	for _, s := range st {
		if s.Lag != s.HighWatermark || s.HighWatermark != s.End {
			t.Errorf("partition %d: lag %d, high watermark %d, end %d: want all equal", s.Partition, s.Lag, s.HighWatermark, s.End)
		}
	}

	held.open()
	// Lag is cached for a second; wait for the commits and a fresh listing.
	eventually(t, 20*time.Second, "lag back to 0", func() bool {
		return sum(t, g, "kpar_partition_commit_lag", nil) == 0 && sum(t, g, "kpar_partition_committed_offset", nil) == n
	})
	if problems, err := testutil.CollectAndLint(pc); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func TestPartitionCollectorWithoutClientOptsHasNoLag(t *testing.T) {
	const topic = "t"
	cluster := newCluster(t, topic, 2)
	produce(t, cluster, topic, 10, 2)
	m := kparprom.New()
	cons, err := kpar.New(kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return nil }),
		kpar.Brokers(cluster.ListenAddrs()...), kpar.Group("g"), kpar.Topics(topic),
		kpar.ClientOptions(kgo.FetchMaxWait(100*time.Millisecond)), kpar.WithHooks(m))
	if err != nil {
		t.Fatal(err)
	}
	pc := m.PartitionCollector(cons.Partitions)
	run(t, cons)
	eventually(t, 20*time.Second, "records handled", func() bool { return m.Totals().Handled >= 10 })
	if got := testutil.CollectAndCount(pc, "kpar_partition_window_end"); got != 2 {
		t.Errorf("kpar_partition_window_end has %d series, want 2", got)
	}
	if got := testutil.CollectAndCount(pc, "kpar_partition_commit_lag", "kpar_partition_high_watermark"); got != 0 {
		t.Errorf("lag and high watermark have %d series without ClientOpts, want none", got)
	}
	if ok, why := m.Ready(); !ok {
		t.Errorf("Ready() = false (%s) with partitions assigned, want true (kpar hooks alone)", why)
	}
}

func TestReadyFollowsGroupMembership(t *testing.T) {
	const topic = "t"
	cluster := newCluster(t, topic, 1)

	m1, m2 := kparprom.New(), kparprom.New()
	noop := func(context.Context, *kgo.Record) error { return nil }
	c1 := newConsumer(t, cluster, m1, "g", topic, noop)
	c2 := newConsumer(t, cluster, m2, "g", topic, noop)

	if ok, why := m1.Ready(); ok || why != "consumer not started" {
		t.Fatalf("Ready() before Run = %v, %q; want false, %q", ok, why, "consumer not started")
	}
	stop1 := run(t, c1)
	eventually(t, 20*time.Second, "the first member ready", func() bool { ok, _ := m1.Ready(); return ok })
	if _, why := m1.Ready(); why != "1 partition assigned in group g" {
		t.Errorf("first member: Ready() says %q, want %q", why, "1 partition assigned in group g")
	}

	// The second member joins a group whose only partition is taken: it is
	// idle, and ready.
	stop2 := run(t, c2)
	eventually(t, 20*time.Second, "both members ready, one idle", func() bool {
		ok1, why1 := m1.Ready()
		ok2, why2 := m2.Ready()
		return ok1 && ok2 && (strings.Contains(why1, "idle") != strings.Contains(why2, "idle"))
	})

	if err := stop1(); err != nil {
		t.Fatal(err)
	}
	if ok, why := m1.Ready(); ok || why != "consumer stopped" {
		t.Errorf("Ready() after Run returned = %v, %q; want false, %q", ok, why, "consumer stopped")
	}
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
}

// TestNotReadyWhileATopicIsGone: a member whose topic was deleted (or
// deleted and created again) is not ready until kpar consumes it again.
func TestNotReadyWhileATopicIsGone(t *testing.T) {
	m := kparprom.New()
	m.OnPartitionsAssigned(map[string][]int32{"t": {0}})
	if ok, why := m.Ready(); !ok {
		t.Fatalf("Ready() with a partition = false, %q", why)
	}
	m.OnTopicUnavailable("t", errors.New("UNKNOWN_TOPIC_ID"))
	if ok, why := m.Ready(); ok || !strings.Contains(why, "topic t is gone") {
		t.Fatalf("Ready() with the topic gone = %v, %q; want false, naming the topic", ok, why)
	}
	m.OnTopicUnavailable("t", nil)
	if ok, why := m.Ready(); !ok {
		t.Fatalf("Ready() once the topic is back = false, %q", why)
	}
}

func TestNewWithNamespaceAndSharedRegistry(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a := kparprom.New(kparprom.Registry(reg), kparprom.Namespace("a"))
	b := kparprom.New(kparprom.Registry(reg), kparprom.Namespace("b"))
	r := &kgo.Record{Topic: "x"}
	a.OnRecordDispatched(r, 1)
	a.OnRecordDone(r, 1, 3*time.Millisecond)
	b.OnAttemptFailed(r, 1, kpar.Permanent(errors.New("bad")), 0)
	if got := sum(t, reg, "a_records_handled_total", nil); got != 1 {
		t.Errorf("a_records_handled_total = %v, want 1", got)
	}
	if got := sum(t, reg, "b_attempts_failed_total", map[string]string{"class": "permanent"}); got != 1 {
		t.Errorf("b_attempts_failed_total{class=permanent} = %v, want 1", got)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	if a.Registry() != reg {
		t.Error("Registry() is not the registry given")
	}
}

func TestHandlerServesTheRegistry(t *testing.T) {
	m := kparprom.New()
	m.OnPartitionsAssigned(map[string][]int32{"x": {0, 1}})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{"kpar_ready 1", `kpar_partitions_assigned_total{topic="x"} 2`} {
		if !strings.Contains(body, want) {
			t.Errorf("Handler() output lacks %q:\n%s", want, body)
		}
	}
}

func TestCommitErrorsLeaveOutCommitsCancelledByShutdown(t *testing.T) {
	m := kparprom.New()
	m.OnCommit(map[string]map[int32]int64{"x": {0: 5}}, nil)
	m.OnCommit(nil, fmt.Errorf("commit: %w", context.Canceled))
	m.OnCommit(nil, errors.New("NOT_COORDINATOR"))
	if got := sum(t, m.Registry(), "kpar_commits_total", nil); got != 3 {
		t.Errorf("kpar_commits_total = %v, want 3", got)
	}
	if got := sum(t, m.Registry(), "kpar_commit_errors_total", nil); got != 1 {
		t.Errorf("kpar_commit_errors_total = %v, want 1", got)
	}
}

func TestMetricsReportDeadLettersAndStuckRecords(t *testing.T) {
	const topic, n = "t", 40
	cluster := newCluster(t, topic, 4)
	produce(t, cluster, topic, n, n)

	m := kparprom.New()
	held := newGate()
	sink := &memSink{failFirst: 1}
	cons := newConsumer(t, cluster, m, "g", topic, func(ctx context.Context, r *kgo.Record) error {
		switch {
		case r.Partition == 0 && r.Offset == 0: // holds partition 0's window start
			return held.wait(ctx)
		case r.Offset%3 == 2:
			return kpar.Permanent(errors.New("bad record"))
		}
		return nil
	}, kpar.DeadLetters(sink), kpar.StuckAfter(200*time.Millisecond))
	stop := run(t, cons)
	t.Cleanup(held.open) // registered after run's cleanup, so it runs before the consumer stops

	eventually(t, 20*time.Second, "every other record finished and the held one reported stuck", func() bool {
		tot := m.Totals()
		return tot.Handled+tot.DeadLettered == n-1 && tot.Stuck == 1
	})
	tot := m.Totals()
	if tot.DeadLettered == 0 || tot.DeadLetterErrors != 1 {
		t.Errorf("Totals() = %+v, want dead letters and one failed dead-letter write", tot)
	}
	reg := m.Registry()
	for _, c := range []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"kpar_records_dead_lettered_total", map[string]string{"topic": topic, "class": "permanent"}, float64(tot.DeadLettered)},
		{"kpar_attempts_failed_total", map[string]string{"topic": topic, "class": "permanent"}, float64(tot.DeadLettered)},
		{"kpar_dead_letter_errors_total", nil, 1},
		{"kpar_records_stuck_total", map[string]string{"topic": topic}, 1},
	} {
		if got := sum(t, reg, c.name, c.match); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.match, got, c.want)
		}
	}
	dls := m.RecentDeadLetters()
	if len(dls) != int(tot.DeadLettered) {
		t.Fatalf("RecentDeadLetters() has %d entries, want %d", len(dls), tot.DeadLettered)
	}
	for _, d := range dls {
		if d.Topic != topic || d.Offset%3 != 2 || d.Class != "permanent" || d.Attempts != 1 || !strings.Contains(d.Error, "bad record") || d.Time.IsZero() {
			t.Errorf("dead letter %+v, want a permanent failure of an offset 2 mod 3 after 1 attempt", d)
		}
	}
	for i := 1; i < len(dls); i++ {
		if dls[i].Time.After(dls[i-1].Time) {
			t.Errorf("RecentDeadLetters() not newest first at %d", i)
		}
	}

	g := collectorGatherer(t, m.PartitionCollector(cons.Partitions))
	for _, s := range gather(t, g, "kpar_partition_stuck_seconds") {
		if stuck := s.value > 0; stuck != (s.labels["partition"] == "0") {
			t.Errorf("kpar_partition_stuck_seconds%v = %v, want > 0 for partition 0 only", s.labels, s.value)
		}
	}
	st := m.PartitionStatus(context.Background(), cons.Partitions())
	if st[0].StuckOffset != 0 || st[0].StuckFor < 200*time.Millisecond {
		t.Errorf("partition 0 stuck at %d for %v, want offset 0 for at least 200ms", st[0].StuckOffset, st[0].StuckFor)
	}

	held.open()
	eventually(t, 20*time.Second, "the stuck record finished", func() bool {
		return sum(t, g, "kpar_partition_stuck_seconds", nil) == 0 && m.Totals().Handled+m.Totals().DeadLettered == n
	})
	if st := m.PartitionStatus(context.Background(), cons.Partitions()); st[0].StuckOffset != -1 {
		t.Errorf("partition 0 still stuck at %d after its record finished", st[0].StuckOffset)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if len(sink.letters) != int(tot.DeadLettered) {
		t.Errorf("sink holds %d letters, hooks reported %d", len(sink.letters), tot.DeadLettered)
	}
}

// TestBacklogIsBelowLagWhenRecordsFinishOutOfOrder holds offset 0 while
// offsets 1-19 finish: the commit lag is the whole partition (the
// committed offset stays at 0), the backlog is one record.
func TestBacklogIsBelowLagWhenRecordsFinishOutOfOrder(t *testing.T) {
	const topic, n = "t", 20
	cluster := newCluster(t, topic, 1)
	produce(t, cluster, topic, n, n)
	m := kparprom.New()
	held := newGate()
	cons := newConsumer(t, cluster, m, "g", topic, func(ctx context.Context, r *kgo.Record) error {
		if r.Offset == 0 {
			return held.wait(ctx)
		}
		return nil
	})
	pc := m.PartitionCollector(cons.Partitions)
	g := collectorGatherer(t, pc)
	run(t, cons)
	eventually(t, 20*time.Second, "19 records finished above the held one", func() bool {
		return sum(t, g, "kpar_partition_window_finished", nil) == n-1 && sum(t, g, "kpar_partition_commit_lag", nil) == n
	})
	if got := sum(t, g, "kpar_backlog_records", nil); got != 1 {
		t.Errorf("kpar_backlog_records = %v, want 1 (commit lag is %d)", got, n)
	}
	if got := sum(t, g, "kpar_backlog_records_all", nil); got != 1 {
		t.Errorf("kpar_backlog_records_all = %v, want 1", got)
	}
	held.open()
	eventually(t, 20*time.Second, "backlog 0", func() bool { return sum(t, g, "kpar_backlog_records_all", nil) == 0 })
}
