package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// Logs that tell (issue 37). franz-go retries a broker it cannot reach
// for ever, and a join the group holds back waits in silence: with a
// wrong --brokers the log said "starting" and nothing for 25 s, and a
// restart after kill -9 sat silent for 44 s before "partitions assigned".
// brokerWatch watches every connection attempt of the forwarder's clients
// (kgo.HookBrokerConnect) and the group's assignments (kpar's hook), and
// says what it waits for: the broker it cannot reach and why, again every
// brokerReport while it lasts, and, while no partitions come, the group
// and protocol, how long the wait can last and what shortens it.
//
// It is also /readyz's one account of the brokers (unreachable). A member
// whose brokers are down has nothing to fetch and nothing it can commit,
// yet may still hold its assignment (the consumer protocol and share
// groups keep it through an outage; the classic protocol's member is
// dropped, which kparprom's Ready sees), and with nothing held in memory
// the lag cannot be listed: the stall rule alone would say ready. So a
// member is not ready while no broker was ever reached and every dial
// fails (a wrong --brokers), or once it could not connect to any broker,
// and read no answer from one since, for brokerGrace. Only failed
// connections count as failures: a read that fails also ends when kgo
// closes an idle connection or cancels a fetch, and an idle member's next
// answer may be a fetch's full wait (5s) away.

const (
	// brokerReport is how often a broker that stays unreachable is
	// reported again (the first failure is reported at once).
	brokerReport = 10 * time.Second
	// joinNote is how long a member goes without partitions before the
	// log says what the group may be waiting for: longer than a join
	// takes (Kafka delays a new group's first rebalance by 3s), and then
	// again every joinReport.
	joinNote   = 8 * time.Second
	joinReport = 15 * time.Second
	// brokerGrace is how long dials may fail with no answer from any
	// broker before a member that reached one is not ready: long enough
	// for kgo to redial a broker that closed one connection, short enough
	// to see a broker restart.
	brokerGrace = 2 * time.Second
)

// brokerWatch is a kgo hook for every client of one command and a kpar
// hook for its consumer. Its methods are safe for concurrent use.
type brokerWatch struct {
	log  *slog.Logger
	what string // the command, for the log: "kpar forward"

	reached  atomic.Bool // a broker answered once
	joined   atomic.Bool // the group assigned this member (maybe nothing)
	assigned atomic.Bool // the group assigned this member partitions
	cl       atomic.Pointer[kgo.Client]
	// failing is when the first connection failed since a broker last
	// answered (a read, or a connection that opened), in UnixNano; 0 for
	// none. Lock-free: OnBrokerRead reads it on every answer.
	failing atomic.Int64

	mu       sync.Mutex // guards addrs, lastAddr and lastErr
	addrs    map[string]*brokerState
	lastAddr string // the latest failed connection's address
	lastErr  error  // and its error
}

// brokerState is the spell of failed connections to one address.
type brokerState struct {
	failing bool
	since   time.Time // the spell's first failure
	err     error     // its latest failure
	logged  time.Time // its latest warning
	total   int       // failed attempts of the spell
}

var (
	_ kgo.HookBrokerConnect       = (*brokerWatch)(nil)
	_ kgo.HookBrokerRead          = (*brokerWatch)(nil)
	_ kgo.HookNewClient           = (*brokerWatch)(nil)
	_ kpar.HookPartitionsAssigned = (*brokerWatch)(nil)
)

func newBrokerWatch(log *slog.Logger, what string) *brokerWatch {
	return &brokerWatch{log: log, what: what, addrs: map[string]*brokerState{}}
}

// clientOpt hooks a client's connection attempts.
func (w *brokerWatch) clientOpt() kgo.Opt { return kgo.WithHooks(w) }

// opts are the options that let w watch a Consumer.
func (w *brokerWatch) opts() []kpar.ConsumerOpt {
	return []kpar.ConsumerOpt{kpar.WithHooks(w), kpar.ClientOptions(w.clientOpt())}
}

// OnNewClient implements kgo.HookNewClient: the client of the group or
// share group, for describing it (not the check's, nor a producer's).
func (w *brokerWatch) OnNewClient(cl *kgo.Client) {
	g, _ := cl.OptValue(kgo.ConsumerGroup).(string)
	share, _ := cl.OptValue(kgo.ShareGroup).(string)
	if g != "" || share != "" {
		w.cl.Store(cl)
	}
}

// OnPartitionsAssigned implements kpar.HookPartitionsAssigned.
func (w *brokerWatch) OnPartitionsAssigned(assigned map[string][]int32) {
	w.joined.Store(true)
	for _, ps := range assigned {
		if len(ps) > 0 {
			w.assigned.Store(true)
		}
	}
}

// OnBrokerConnect implements kgo.HookBrokerConnect: the first failure of
// an address is a warning at once, the next ones a summary every
// brokerReport, and the first success after them a line saying so.
func (w *brokerWatch) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, kgo.ErrClientClosed)) {
		return // the client is closing, not the broker failing
	}
	addr := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	now := time.Now()
	w.mu.Lock()
	st := w.addrs[addr]
	if st == nil {
		st = &brokerState{}
		w.addrs[addr] = st
	}
	if err == nil {
		w.answered()
		was, since, total := st.failing, st.since, st.total
		*st = brokerState{}
		w.mu.Unlock()
		if was {
			w.log.Info(w.what+": broker reachable again", "broker", addr, "unreachable_for", now.Sub(since).Round(time.Second), "failed_connects", total)
		}
		return
	}
	w.failing.CompareAndSwap(0, now.UnixNano())
	w.lastAddr, w.lastErr = addr, err
	st.err = err
	st.total++
	if !st.failing {
		st.failing, st.since, st.logged, st.total = true, now, now, 1
		w.mu.Unlock()
		w.log.Warn(w.what+": cannot reach broker; retrying (check --brokers, and that the broker's advertised listeners resolve and are reachable from here)",
			"broker", addr, "err", err)
		return
	}
	if now.Sub(st.logged) < brokerReport {
		w.mu.Unlock()
		return
	}
	total, since := st.total, st.since
	st.logged = now
	w.mu.Unlock()
	w.log.Warn(w.what+": still cannot reach broker; retrying",
		"broker", addr, "for", now.Sub(since).Round(time.Second), "failed_connects", total, "err", err)
}

// OnBrokerRead implements kgo.HookBrokerRead: an answer.
func (w *brokerWatch) OnBrokerRead(_ kgo.BrokerMetadata, _ int16, _ int, _, _ time.Duration, err error) {
	if err == nil && (w.failing.Load() != 0 || !w.reached.Load()) {
		w.answered()
	}
}

// answered notes that a broker answered: connections failing before it
// do not count.
func (w *brokerWatch) answered() {
	w.reached.Store(true)
	w.failing.Store(0)
}

// unreachable says, for /readyz, whether the brokers cannot be reached
// (see brokerWatch), and why.
func (w *brokerWatch) unreachable() (string, bool) {
	if w == nil {
		return "", false
	}
	f := w.failing.Load()
	if f == 0 {
		return "", false
	}
	failing := time.Since(time.Unix(0, f))
	reached := w.reached.Load()
	if reached && failing < brokerGrace {
		return "", false
	}
	w.mu.Lock()
	var addrs []string
	for a, st := range w.addrs {
		if st.failing {
			addrs = append(addrs, a)
		}
	}
	addr, err := w.lastAddr, w.lastErr
	w.mu.Unlock()
	if err == nil {
		return "", false
	}
	if reached {
		return fmt.Sprintf("no broker could be reached for %v (nothing can be fetched or committed); last error: %s", failing.Round(time.Second), excerpt(addr+": "+err.Error())), true
	}
	slices.Sort(addrs)
	return fmt.Sprintf("cannot reach brokers %s for %v: %s", strings.Join(addrs, ","), failing.Round(time.Second), excerpt(err.Error())), true
}

// lastError is the latest connection error, or nil.
func (w *brokerWatch) lastError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// stoppedEarly logs a stop that came before the member ever joined its
// group and returns the exit code: 1 when no broker was ever reached (the
// configuration is wrong, and a supervisor should see it), else 0. It
// returns false when the member had joined: the usual stop lines follow.
func (w *brokerWatch) stoppedEarly(seeds []string, groupKey, group string) (int, bool) {
	if !w.reached.Load() {
		err := w.lastError()
		if err == nil {
			err = errors.New("no connection attempt finished")
		}
		w.log.Error(w.what+" stopped before it ever reached a broker: nothing was consumed; check --brokers",
			"brokers", strings.Join(seeds, ","), groupKey, group, "err", err)
		return 1, true
	}
	if w.joined.Load() {
		return 0, false
	}
	w.log.Warn(w.what+" stopped before the member joined its group: nothing was consumed", groupKey, group)
	return 0, true
}

// watchJoin runs joinWait beside Consumer.Run until stop, which waits
// for it.
func (w *brokerWatch) watchJoin(ctx context.Context, group string, protocol kpar.Protocol, sessionTimeout, rebalanceTimeout time.Duration, instanceID string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.joinWait(ctx, group, protocol, sessionTimeout, rebalanceTimeout, instanceID)
	}()
	return func() { cancel(); <-done }
}

// joinWait says what the group may be waiting for while the member has
// no partitions, after joinNote and then every joinReport, until it gets
// some or ctx ends.
func (w *brokerWatch) joinWait(ctx context.Context, group string, protocol kpar.Protocol, sessionTimeout, rebalanceTimeout time.Duration, instanceID string) {
	start := time.Now()
	noted := false // the first note says it all, the next ones how long
	t := time.NewTimer(joinNote)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.assigned.Load() {
			return
		}
		if _, bad := w.unreachable(); !bad { // else the broker warnings say why
			if !noted {
				w.noteJoinWait(ctx, time.Since(start), group, protocol, sessionTimeout, rebalanceTimeout, instanceID)
				noted = true
			} else {
				attrs := []any{"group", group, "waited", time.Since(start).Round(time.Second)}
				if others := w.otherMembers(ctx, group, protocol); others != "" {
					attrs = append(attrs, "other_members", others)
				}
				w.log.Warn(w.what+": still no partitions assigned", attrs...)
			}
		}
		t.Reset(joinReport)
	}
}

// noteJoinWait logs one note of joinWait.
func (w *brokerWatch) noteJoinWait(ctx context.Context, waited time.Duration, group string, protocol kpar.Protocol, sessionTimeout, rebalanceTimeout time.Duration, instanceID string) {
	var atMost, shorter string
	if protocol == kpar.ConsumerProtocol {
		atMost = "the broker's session timeout (group.consumer.session.timeout.ms, 45s by default; kpar broker --consumer-session-timeout)"
		shorter = "stop members with SIGTERM (a member that leaves frees its partitions at once), and give each an --instance-id (a restarted member takes its place); --session-timeout does not apply to this protocol"
	} else {
		atMost = fmt.Sprintf("the old member's --session-timeout (%v here), or its --rebalance-timeout (%v here) if it died mid-rebalance", sessionTimeout, rebalanceTimeout)
		shorter = "stop members with SIGTERM (a member that leaves frees its partitions at once), give each an --instance-id (a restarted member takes its place without a rebalance), or a shorter --session-timeout"
	}
	if instanceID != "" {
		shorter = "this member has --instance-id " + instanceID + ", so a restart within the session takes its old place; else " + shorter
	}
	attrs := []any{"group", group, "group_protocol", protocol.String(), "waited", waited.Round(time.Second), "at_most", atMost, "shorter_next_time", shorter}
	if others := w.otherMembers(ctx, group, protocol); others != "" {
		attrs = append(attrs, "other_members", others)
	}
	w.log.Warn(w.what+": no partitions assigned yet: the group is likely waiting for the session of a member that stopped without leaving (kill -9, a crash, an OOM kill) to expire before it moves that member's partitions; or every partition is taken by other members",
		attrs...)
}

// otherMembers describes the members the group counts besides this one
// ("member-id (client kgo, host /127.0.0.1)"), best effort: "" when the
// group cannot be described in a few seconds.
func (w *brokerWatch) otherMembers(ctx context.Context, group string, protocol kpar.Protocol) string {
	cl := w.cl.Load()
	if cl == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	self, _ := cl.GroupMetadata()
	adm := kadm.NewClient(cl)
	var out []string
	add := func(id, client, host string, instance *string) {
		if id == self {
			return
		}
		s := fmt.Sprintf("%s (client %s, host %s", id, client, host)
		if instance != nil {
			s += ", instance " + *instance
		}
		out = append(out, s+")")
	}
	if protocol == kpar.ConsumerProtocol {
		gs, err := adm.DescribeConsumerGroups(ctx, group)
		if err != nil {
			return ""
		}
		for _, g := range gs {
			for _, m := range g.Members {
				add(m.MemberID, m.ClientID, m.ClientHost, m.InstanceID)
			}
		}
	} else {
		gs, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return ""
		}
		for _, g := range gs {
			for _, m := range g.Members {
				add(m.MemberID, m.ClientID, m.ClientHost, m.InstanceID)
			}
		}
	}
	return strings.Join(out, "; ")
}
