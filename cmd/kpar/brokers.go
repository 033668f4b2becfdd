package main

import (
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Readiness from the brokers. A member whose brokers are down has nothing
// to fetch and nothing it can commit, yet may still hold its assignment
// (the consumer protocol and share groups keep it through an outage; the
// classic protocol's member is dropped, which kparprom's Ready sees), and
// with nothing held in memory the lag cannot be listed: the stall rule
// alone would say ready. So a member that could not connect to any broker,
// and read no answer from one since, for brokerGrace is not ready.
//
// Only failed connections count as failures: a read that fails also ends
// when kgo closes an idle connection or cancels a fetch, and an idle
// member's next answer may be a fetch's full wait (5s) away.

// brokerGrace is how long dials may fail with no answer from any broker
// before the member is not ready: long enough for kgo to redial a broker
// that closed one connection, short enough to see a broker restart.
const brokerGrace = 2 * time.Second

// brokerAnswers is when a broker last answered and the first failed
// connection since. Lock-free: the client's hooks call it on every read.
type brokerAnswers struct {
	answered atomic.Int64 // UnixNano of the latest answer (a read or a connection that opened)
	failing  atomic.Int64 // UnixNano of the first failed connection since then; 0 for none
	lastErr  atomic.Pointer[string]
}

func (b *brokerAnswers) answer(now time.Time) {
	b.answered.Store(now.UnixNano())
	if b.failing.Load() != 0 {
		b.failing.Store(0)
	}
}

func (b *brokerAnswers) dialFailed(now time.Time, addr string, err error) {
	msg := fmt.Sprintf("%s: %v", addr, err)
	b.lastErr.Store(&msg)
	b.failing.CompareAndSwap(0, now.UnixNano())
}

// unreachable reports whether no broker could be reached for brokerGrace,
// and says so.
func (b *brokerAnswers) unreachable(now time.Time) (bool, string) {
	f := b.failing.Load()
	if f == 0 || now.Sub(time.Unix(0, f)) < brokerGrace {
		return false, ""
	}
	why := fmt.Sprintf("no broker could be reached for %v (nothing can be fetched or committed)", now.Sub(time.Unix(0, f)).Round(time.Second))
	if e := b.lastErr.Load(); e != nil {
		why += "; last error: " + excerpt(*e)
	}
	return true, why
}

var (
	_ kgo.HookBrokerConnect = stallClient{}
	_ kgo.HookBrokerRead    = stallClient{}
)

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (h stallClient) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		h.p.answers.dialFailed(time.Now(), net.JoinHostPort(meta.Host, fmt.Sprint(meta.Port)), err)
		return
	}
	h.p.answers.answer(time.Now())
}

// OnBrokerRead implements kgo.HookBrokerRead.
func (h stallClient) OnBrokerRead(_ kgo.BrokerMetadata, _ int16, _ int, _, _ time.Duration, err error) {
	if err == nil {
		h.p.answers.answer(time.Now())
	}
}
