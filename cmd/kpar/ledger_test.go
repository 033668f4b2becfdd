package main

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/internal/ledger"
)

// The chaos tests of `kpar forward` check their runs with internal/ledger,
// the checker the engine's tests and `kpar demo` use: the producer feeds it
// every acknowledged record, the endpoint every 2xx it answers.

// ledgerEndpoint is the HTTP service `kpar forward` posts to in the chaos
// tests. It identifies each request's record by the Kpar-Topic,
// -Partition, -Offset and -Key headers and notes every 2xx answer in its
// ledger before answering (the forwarder cannot start the next record of a
// key before it reads the answer, so the ledger sees first successes in
// the order the forwarder caused them).
type ledgerEndpoint struct {
	srv *httptest.Server
	l   *ledger.Ledger
	// topic is the records' topic when a request has no Kpar-Topic
	// header (older builds, KPAR_CHAOS_BIN).
	topic string
	// answer decides the status of an attempt (from 1) of the record with
	// value index, and how long the endpoint works on it first.
	answer func(index, attempt int) (status int, work time.Duration)

	active atomic.Int64 // requests being answered now

	mu       sync.Mutex // guards attempts and bad
	attempts map[int]int
	bad      []string
}

func newLedgerEndpoint(t *testing.T, l *ledger.Ledger, topic string, answer func(index, attempt int) (int, time.Duration)) *ledgerEndpoint {
	t.Helper()
	e := &ledgerEndpoint{l: l, topic: topic, answer: answer, attempts: map[int]int{}}
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *ledgerEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.active.Add(1)
	defer e.active.Add(-1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the client died mid-request (a SIGKILLed forwarder): nothing was delivered
	}
	i, err1 := strconv.Atoi(string(body))
	part, err2 := strconv.ParseInt(r.Header.Get(forward.HeaderPartition), 10, 32)
	off, err3 := strconv.ParseInt(r.Header.Get(forward.HeaderOffset), 10, 64)
	key, err4 := base64.StdEncoding.DecodeString(r.Header.Get(forward.HeaderKey))
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		e.mu.Lock()
		e.bad = append(e.bad, fmt.Sprintf("%q %v", body, r.Header))
		e.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.attempts[i]++
	attempt := e.attempts[i]
	e.mu.Unlock()
	status, work := e.answer(i, attempt)
	if work > 0 {
		time.Sleep(work) // the service's own work, not a wait for anything
	}
	if status/100 == 2 {
		e.l.Handled(&kgo.Record{Topic: cmp.Or(r.Header.Get(forward.HeaderTopic), e.topic), Partition: int32(part), Offset: off, Key: key})
	}
	w.WriteHeader(status)
}

// malformed returns the requests the endpoint could not read.
func (e *ledgerEndpoint) malformed() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bad
}

// streamProducer produces keyed records ("k<i mod keys>", value "<i>")
// at a steady rate until stopped, noting each acknowledged one in the
// ledger: production goes on while the chaos happens.
type streamProducer struct {
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
	// started is closed on the first acknowledgement: the topic exists.
	started   chan struct{}
	startOnce sync.Once
	acked     atomic.Int64
	failed    atomic.Int64
	first     atomic.Value // the first produce error
	once      sync.Once    // stop runs once: by the test, else at cleanup
}

// startProducer produces perSecond records a second to topic.
func startProducer(ctx context.Context, t *testing.T, addr, topic string, perSecond, keys int, l *ledger.Ledger) *streamProducer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(addr, ",")...), kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation(),
		kgo.ProducerLinger(time.Millisecond), kgo.RecordRetries(1000), kgo.RecordDeliveryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &streamProducer{cl: cl, cancel: cancel, done: make(chan struct{}), started: make(chan struct{})}
	go func() {
		defer close(p.done)
		const tick = 10 * time.Millisecond
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		per := max(1, perSecond*int(tick)/int(time.Second))
		for i := 0; ; {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			for range per {
				r := &kgo.Record{Key: fmt.Appendf(nil, "k%03d", i%keys), Value: []byte(strconv.Itoa(i))}
				i++
				cl.Produce(context.WithoutCancel(ctx), r, func(r *kgo.Record, err error) {
					if err != nil {
						p.failed.Add(1)
						p.first.CompareAndSwap(nil, err)
						return
					}
					l.Produced(r)
					p.acked.Add(1)
					p.startOnce.Do(func() { close(p.started) })
				})
			}
		}
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop ends production, waits for every acknowledgement and returns how
// many records were acknowledged.
func (p *streamProducer) stop(t *testing.T) int64 {
	t.Helper()
	p.once.Do(func() { p.flush(t) })
	return p.acked.Load()
}

func (p *streamProducer) flush(t *testing.T) {
	t.Helper()
	p.cancel()
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.cl.Flush(ctx); err != nil {
		t.Errorf("flushing the producer: %v", err)
	}
	p.cl.Close()
	if n := p.failed.Load(); n > 0 {
		t.Errorf("%d records not produced; first error: %v", n, p.first.Load())
	}
}

// waitReached waits until the ledger has n finished records, failing the
// test with the ledger's report when d passes first.
func waitReached(t *testing.T, l *ledger.Ledger, n int64, d time.Duration, what string) {
	t.Helper()
	select {
	case <-l.Reached(n):
	case <-time.After(d):
		t.Fatalf("waiting %v for %s (%d records): %+v", d, what, n, l.Report())
	}
}
