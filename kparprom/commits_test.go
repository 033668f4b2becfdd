package kparprom_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/kparprom"
)

// commitBytes is a kpar.HookCommitRequest that adds up the bytes it is
// told of, to compare the counter with, and counts the requests cancelled
// in flight, which may or may not have reached the broker.
type commitBytes struct {
	atomic.Int64
	mu                                sync.Mutex
	cancelledRequests, cancelledParts int
}

func (c *commitBytes) OnCommitRequest(partitions, bytes int, err error) {
	c.Add(int64(bytes))
	if errors.Is(err, context.Canceled) {
		c.mu.Lock()
		c.cancelledRequests++
		c.cancelledParts += partitions
		c.mu.Unlock()
	}
}

// TestCommitRequestCountersMatchTheBroker runs a member on 4 partitions and
// compares its commit-traffic counters with the OffsetCommit requests the
// broker received from its group.
func TestCommitRequestCountersMatchTheBroker(t *testing.T) {
	const topic, group, n = "t", "g", 400
	cluster := newCluster(t, topic, 4)
	produce(t, cluster, topic, n, 50)

	var (
		mu                  sync.Mutex
		atBroker, partsSeen int
		wireBytes           int // the request bodies at the version they were sent with
	)
	cluster.ControlKey(int16(kmsg.OffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.OffsetCommitRequest)
		if req.Group == group {
			mu.Lock()
			atBroker++
			for _, rt := range req.Topics {
				partsSeen += len(rt.Partitions)
			}
			wireBytes += len(req.AppendTo(nil))
			mu.Unlock()
		}
		return nil, nil, false // observe only; kept, since it handles nothing
	})

	m := kparprom.New()
	told := &commitBytes{}
	cons := newConsumer(t, cluster, m, group, topic, func(ctx context.Context, _ *kgo.Record) error {
		select { // a little work, so that commits carry finished offsets
		case <-time.After(time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, kpar.Concurrency(16), kpar.CommitInterval(5*time.Millisecond), kpar.WithHooks(told))
	stop := run(t, cons)
	eventually(t, 20*time.Second, "every record handled", func() bool { return m.Totals().Handled >= n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	reg := m.Registry()
	reqs := sum(t, reg, "kpar_commit_requests_total", nil)
	parts := sum(t, reg, "kpar_commit_request_partitions_total", nil)
	nbytes := sum(t, reg, "kpar_commit_request_bytes_total", nil)
	mu.Lock()
	defer mu.Unlock()
	told.mu.Lock()
	cancelled, cancelledParts := told.cancelledRequests, told.cancelledParts
	told.mu.Unlock()
	t.Logf("%v requests, %v partitions, %v bytes (%d at the wire version), %d cancelled in flight", reqs, parts, nbytes, wireBytes, cancelled)
	// A request cancelled in flight at shutdown counts whether or not
	// it reached the broker: in 60 -race runs beside two CPU hogs, 1 of
	// 4 such requests had not.
	if reqs < 2 || reqs < float64(atBroker) || reqs > float64(atBroker+cancelled) {
		t.Errorf("kpar_commit_requests_total = %v, want the %d OffsetCommit requests the broker received (at least 2), plus at most the %d cancelled in flight",
			reqs, atBroker, cancelled)
	}
	if parts < reqs || parts < float64(partsSeen) || parts > float64(partsSeen+cancelledParts) {
		t.Errorf("kpar_commit_request_partitions_total = %v, want the %d partitions the broker received (plus at most the %d of requests cancelled in flight), at least one per request",
			parts, partsSeen, cancelledParts)
	}
	if nbytes != float64(told.Load()) || nbytes < 20*reqs {
		t.Errorf("kpar_commit_request_bytes_total = %v, want the %d bytes the hook reported, at least 20 a request", nbytes, told.Load())
	}
}

// TestCommitRequestCountersSkipCommitsNeverSent counts a failed request that
// was built and sent, and leaves out one that never became a request.
func TestCommitRequestCountersSkipCommitsNeverSent(t *testing.T) {
	m := kparprom.New()
	m.OnCommitRequest(3, 250, nil)
	m.OnCommitRequest(1, 90, errors.New("NOT_COORDINATOR"))
	m.OnCommitRequest(0, 0, errors.New("no generation: not a member yet"))
	reg := m.Registry()
	for name, want := range map[string]float64{
		"kpar_commit_requests_total":           2,
		"kpar_commit_request_partitions_total": 4,
		"kpar_commit_request_bytes_total":      340,
	} {
		if got := sum(t, reg, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}
