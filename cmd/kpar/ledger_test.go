package main

import (
	"cmp"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
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
