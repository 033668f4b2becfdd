package kpar

import (
	"errors"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// heartbeatIfForgotten makes a consumer-protocol member heartbeat at once
// when its commit says the group no longer knows it (UNKNOWN_MEMBER_ID,
// FENCED_MEMBER_EPOCH: a broker restarted after a kill -9 forgets its
// members, and a session can expire). kgo leaves that to the heartbeat
// loop in the consumer protocol, and after an outage the loop's retry
// backoff had grown to 2-3.5s: the member went on finishing records it
// could not commit, and a member stopped meanwhile failed its final
// commit (issue 35). The heartbeat is refused the same way, the member
// loses its partitions and gets them back with what it finished
// (lostwork.go). The classic protocol needs none of this: kgo rejoins
// from the commit itself there.
func (g *groupSource) heartbeatIfForgotten(err error) {
	if err == nil || g.e.cfg.protocol != ConsumerProtocol {
		return
	}
	if errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.FencedMemberEpoch) {
		g.cl.ForceRebalance() // in the consumer protocol: one full heartbeat now
	}
}

// brokerBack drops the settle backoff when the client connects to a broker
// (kgo.HookBrokerConnect): after an outage the next commit came up to 5s
// after the broker was back, the backoff the outage had doubled, and a
// consumer-protocol member the restarted broker forgot learned it only
// from that commit (heartbeatIfForgotten) or its heartbeat; stopped
// meanwhile, it failed its final commit. Connections are made once per
// broker and again only after one broke, so this costs nothing while the
// brokers are up.
type brokerBack struct{ e *engine }

var _ kgo.HookBrokerConnect = brokerBack{}

func (b brokerBack) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		b.e.settleAfresh()
	}
}
