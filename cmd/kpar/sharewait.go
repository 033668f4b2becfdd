package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kpar/kpar"
)

// What a share-group member waits for (issue 35). After a kill -9 of a
// member, the broker keeps that member's share partitions assigned to it
// until its share session expires (45s by default), and the records it
// acquired locked until then or until their acquisition locks expire: a
// restarted member got nothing for that long while /readyz said 503 and
// the log said nothing. shareWait says so, as joinWait does for a group's
// join: once the member has received nothing for joinNote while it holds
// nothing and the group has records waiting that nobody takes, then every
// joinReport, and when records come again.

// shareWatch are the share consumer's figures shareWait follows.
type shareWatch func() (kpar.ShareStats, bool)

// watchShare runs a shareWait beside Consumer.Run until stop, which waits
// for it.
func (w *brokerWatch) watchShare(ctx context.Context, group string, stats shareWatch) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	sw := &shareWait{w: w, group: group, stats: stats,
		backlog: func(ctx context.Context) (shareBacklog, bool) { return w.shareBacklog(ctx, group) }}
	go func() {
		defer close(done)
		sw.run(ctx)
	}()
	return func() { cancel(); <-done }
}

// shareWait follows a share-group member's records. It looks at the
// group's backlog twice before it says anything, halfway through joinNote
// and at its end: records waiting that other members take (fewer the
// second time) are not a wait for a dead member. Owned by its goroutine.
type shareWait struct {
	w       *brokerWatch
	group   string
	stats   shareWatch
	backlog func(context.Context) (shareBacklog, bool)

	received    int64     // ShareStats.Received at the last sample; -1 before the first
	since, next time.Time // since: records last moved; next: the next report
	looked      int64     // the records waiting at the last look; -1 for none since
	noted       bool
}

// run samples every second until ctx ends.
func (s *shareWait) run(ctx context.Context) {
	s.received, s.looked = -1, -1
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sample(ctx, now)
		}
	}
}

func (s *shareWait) sample(ctx context.Context, now time.Time) {
	st, running := s.stats()
	if !running {
		return
	}
	if st.Received != s.received || st.Acquired > 0 { // records came, or are held: no wait
		if s.noted && st.Received != s.received {
			s.w.log.Info(s.w.what+": share group records delivered again", "share_group", s.group, "waited", now.Sub(s.since).Round(time.Second))
		}
		s.moved(now)
		s.received = st.Received
		return
	}
	waited := now.Sub(s.since)
	look := !s.noted && (waited >= joinNote || (s.looked < 0 && waited >= joinNote/2)) || s.noted && !now.Before(s.next)
	if !look {
		return
	}
	if _, bad := s.w.unreachable(); bad { // the broker warnings say why
		return
	}
	b, ok := s.backlog(ctx)
	if !ok {
		return
	}
	before := s.looked
	s.looked = b.waiting
	if b.waiting == 0 || (before >= 0 && b.waiting < before) { // nothing waits, or others take it
		if s.noted {
			s.w.log.Info(s.w.what+": the share group's waiting records go to other members now", "share_group", s.group, "waiting_records", b.waiting)
		}
		s.moved(now)
		return
	}
	switch {
	case !s.noted && waited < joinNote: // the first look
		return
	case !s.noted:
		s.w.log.Warn(s.w.what+": no records delivered while the share group has records waiting: it is likely waiting for a member that stopped without leaving (kill -9, a crash, an OOM kill), whose share partitions stay assigned to it until its share session expires, and the records it acquired locked until then or until their locks expire; or other members hold every record",
			"share_group", s.group, "waited", waited.Round(time.Second), "waiting_records", b.waiting,
			"at_most", b.atMost(),
			"shorter_next_time", "stop members with SIGTERM (a member that leaves gives back its partitions and releases its records at once), or a shorter share session timeout: group.share.session.timeout.ms on the brokers or share.session.timeout.ms on the group (kpar broker --share-session-timeout)",
			"members", b.members)
		s.noted = true
	default:
		s.w.log.Warn(s.w.what+": still no records delivered while the share group has records waiting",
			"share_group", s.group, "waited", waited.Round(time.Second), "waiting_records", b.waiting, "members", b.members)
	}
	s.next = now.Add(joinReport)
}

// moved starts the wait afresh at now.
func (s *shareWait) moved(now time.Time) {
	s.since, s.noted, s.looked = now, false, -1
}

// shareBacklog is what a share group has waiting and who holds it.
type shareBacklog struct {
	waiting       int64  // the group's share-partition lag
	members       string // "id (client kgo, host /127.0.0.1, partitions t[0 1]); ..."
	session, lock string // the brokers' timeouts ("45s"), "" when unknown
}

// shareBacklog describes the group through the share consumer's client,
// best effort: false when the lag cannot be had in a few seconds.
func (w *brokerWatch) shareBacklog(ctx context.Context, group string) (shareBacklog, bool) {
	cl := w.cl.Load()
	if cl == nil {
		return shareBacklog{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	offsets, err := adm.DescribeShareGroupOffsets(ctx, group)
	if err != nil {
		return shareBacklog{}, false
	}
	var b shareBacklog
	for _, d := range offsets {
		for _, ps := range d.Offsets {
			for _, o := range ps {
				b.waiting += max(o.Lag, 0) // -1: not known
			}
		}
	}
	if b.waiting == 0 {
		return b, true
	}
	if gs, err := adm.DescribeShareGroups(ctx, group); err == nil {
		var ms []string
		for _, g := range gs {
			for _, m := range g.Members {
				var parts []string
				m.Assignment.EachPartitions(func(t string, ps []int32) {
					slices.Sort(ps)
					parts = append(parts, fmt.Sprintf("%s%v", t, ps))
				})
				slices.Sort(parts)
				ms = append(ms, fmt.Sprintf("%s (client %s, host %s, partitions %s)", m.MemberID, m.ClientID, m.ClientHost, strings.Join(parts, " ")))
			}
		}
		slices.Sort(ms)
		b.members = strings.Join(ms, "; ")
	}
	if rcs, err := adm.DescribeBrokerConfigs(ctx); err == nil {
		for _, rc := range rcs {
			for _, c := range rc.Configs {
				if c.Value == nil {
					continue
				}
				ms, err := strconv.ParseInt(*c.Value, 10, 64)
				if err != nil {
					continue
				}
				switch c.Key {
				case "group.share.session.timeout.ms":
					b.session = (time.Duration(ms) * time.Millisecond).String()
				case "group.share.record.lock.duration.ms":
					b.lock = (time.Duration(ms) * time.Millisecond).String()
				}
			}
		}
	}
	return b, true
}

// atMost says how long the wait lasts at most.
func (b shareBacklog) atMost() string {
	session, lock := "45s by default", "30s by default"
	if b.session != "" {
		session = b.session + " on this broker"
	}
	if b.lock != "" {
		lock = b.lock + " on this broker"
	}
	return fmt.Sprintf("the share session timeout (group.share.session.timeout.ms, %s) for the dead member's partitions, and the acquisition lock (group.share.record.lock.duration.ms, %s) for the records it acquired, unless the group sets its own (share.session.timeout.ms, share.record.lock.duration.ms)", session, lock)
}
