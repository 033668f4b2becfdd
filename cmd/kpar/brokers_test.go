package main

import (
	"errors"
	"log/slog"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// TestReadinessRefusedCertificate: an attempt refused for a configuration
// error (a certificate that stopped verifying) makes the member not ready
// at once, saying so with the error, however few records wait; a record
// that finishes makes it ready again (issue 35: /readyz said ready while
// the stream was dead-lettered for the certificate).
func TestReadinessRefusedCertificate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w fakeWork
		s := startWatch(t, 15*time.Second, &w)
		w.held.Store(1)
		wait(time.Second)
		wantReady(t, s, "one record held for a second")
		s.OnAttemptFailed(nil, 1, kpar.Misconfigured(errors.New("forward: the TLS certificate of 127.0.0.1:8443 does not verify: x509: certificate signed by unknown authority")), 0)
		wantNotReady(t, s, "the certificate does not verify", "configuration error", "x509: certificate signed by unknown authority")
		wait(time.Minute)
		wantNotReady(t, s, "a minute later", "configuration error since 1m")
		s.OnAttemptFailed(nil, 1, errors.New("500 Internal Server Error"), 0)
		wantNotReady(t, s, "after another failure", "configuration error")
		s.OnRecordDone(nil, 1, 0)
		wait(time.Second) // the stall rule sees it at its next sample
		wantReady(t, s, "a record finished")
	})
}

// TestReadinessBrokersUnreachable: connections to the brokers that fail
// for brokerGrace with no answer since make the member not ready, saying
// why, even with nothing held and no lag known (issue 35: /readyz stayed
// 200 through a 5s broker outage with the consumer protocol and with
// share groups); an answer makes it ready again.
func TestReadinessBrokersUnreachable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w fakeWork
		w.share.Store(true)
		s := startWatch(t, 15*time.Second, &w)
		h := newBrokerWatch(slog.New(slog.DiscardHandler), "kpar forward")
		s.brokers = h
		meta := kgo.BrokerMetadata{NodeID: 0, Host: "127.0.0.1", Port: 9092}
		h.OnBrokerRead(meta, 0, 10, 0, 0, nil)
		wantReady(t, s, "a broker answered")

		refused := &dialError{syscall.ECONNREFUSED}
		h.OnBrokerConnect(meta, 0, nil, refused)
		wait(time.Second)
		h.OnBrokerConnect(meta, 0, nil, refused)
		wantReady(t, s, "dials failing for 1s (within the grace)")
		wait(time.Second + time.Millisecond)
		wantNotReady(t, s, "dials failing for 2s", "no broker could be reached for 2s", "127.0.0.1:9092", "connection refused")

		h.OnBrokerRead(meta, 0, 0, 0, 0, errors.New("EOF"))
		wantNotReady(t, s, "a read failed too", "no broker could be reached")
		h.OnBrokerConnect(meta, 0, nil, nil)
		wantReady(t, s, "a connection opened")
		h.OnBrokerConnect(meta, 0, nil, refused)
		wait(time.Second)
		h.OnBrokerRead(meta, 0, 10, 0, 0, nil)
		wait(5 * time.Second)
		wantReady(t, s, "a broker answered after a failed dial")
	})
}

// dialError is a refused dial as kgo reports it.
type dialError struct{ errno syscall.Errno }

func (e *dialError) Error() string { return "dial tcp 127.0.0.1:9092: connect: " + e.errno.Error() }
