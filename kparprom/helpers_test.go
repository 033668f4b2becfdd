package kparprom_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/kparprom"

	"github.com/kpar/kpar/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newCluster starts a one-broker kfake cluster with topic (partitions
// partitions) and short group timeouts.
func newCluster(t testing.TB, topic string, partitions int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// newConsumer returns a Consumer on topic observed by m, as the kpar forward
// command wires it.
func newConsumer(t testing.TB, c *kfake.Cluster, m *kparprom.Metrics, group, topic string, h kpar.HandlerFunc, extra ...kpar.ConsumerOpt) *kpar.Consumer {
	t.Helper()
	copts := append([]kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.SessionTimeout(2 * time.Second),
		kgo.RebalanceTimeout(5 * time.Second),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}, m.ClientOpts()...)
	cons, err := kpar.New(h, append([]kpar.ConsumerOpt{
		kpar.Group(group),
		kpar.Topics(topic),
		kpar.CommitInterval(50 * time.Millisecond),
		kpar.RetryBackoff(time.Millisecond, 10*time.Millisecond),
		kpar.ShutdownTimeout(10 * time.Second),
		kpar.ClientOptions(copts...),
		kpar.WithHooks(m),
	}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// run runs c until the test ends or stop is called; stop returns Run's
// error.
func run(t testing.TB, c *kpar.Consumer) (stop func() error) { return testkit.Start(t, "Run", c.Run) }

// produce writes n records to topic, record i with key "key-<i%keys>".
func produce(t testing.TB, c *kfake.Cluster, topic string, n, keys int) {
	t.Helper()
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "key-%d", i%keys), Value: fmt.Appendf(nil, "value-%d", i)}
	}
	testkit.Produce(t, c.ListenAddrs(), rs...)
}

// eventually polls cond every 20ms until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sample is one gathered series: its labels and value.
type sample struct {
	labels map[string]string
	value  float64
}

// gather returns the series of the metric family name in g.
func gather(t testing.TB, g prometheus.Gatherer, name string) []sample {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []sample
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			s := sample{labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			s.value = value(mf.GetType(), m)
			out = append(out, s)
		}
	}
	return out
}

func value(typ dto.MetricType, m *dto.Metric) float64 {
	switch typ {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return m.GetUntyped().GetValue()
}

// sum adds the values of the series of name whose labels include match.
func sum(t testing.TB, g prometheus.Gatherer, name string, match map[string]string) float64 {
	t.Helper()
	total := 0.0
next:
	for _, s := range gather(t, g, name) {
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		total += s.value
	}
	return total
}

// collectorGatherer gathers one collector, as a registry of its own.
func collectorGatherer(t testing.TB, c prometheus.Collector) prometheus.Gatherer {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return reg
}

// memSink is a dead-letter sink in memory whose first failFirst writes
// fail.
type memSink struct {
	mu        sync.Mutex
	failFirst int
	letters   []deadletter.Letter
}

func (s *memSink) Write(_ context.Context, ls []deadletter.Letter) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failFirst > 0 {
		s.failFirst--
		return errors.New("sink unavailable")
	}
	s.letters = append(s.letters, ls...)
	return nil
}

// gate holds handlers until it opens, or until their attempt ends. Opening
// it again is harmless, so a test may also open it at cleanup.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

// wait blocks until g opens (nil) or ctx ends (ctx's error).
func (g *gate) wait(ctx context.Context) error {
	select {
	case <-g.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }
