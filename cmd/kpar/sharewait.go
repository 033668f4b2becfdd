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
// nothing and the group has records waiting, then every joinReport, and
// when records come again.

// shareWatch are the share consumer's figures shareWait follows.
type shareWatch func() (kpar.ShareStats, bool)

// watchShare runs shareWait beside Consumer.Run until stop, which waits
// for it.
func (w *brokerWatch) watchShare(ctx context.Context, group string, stats shareWatch) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.shareWait(ctx, group, stats, time.Second)
	}()
	return func() { cancel(); <-done }
}

// shareWait samples stats every tick until ctx ends.
func (w *brokerWatch) shareWait(ctx context.Context, group string, stats shareWatch, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	received := int64(-1)
	var since, next time.Time // since: the last record received; next: the next report
	noted := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, running := stats()
		if !running {
			continue
		}
		now := time.Now()
		if st.Received != received || st.Acquired > 0 { // records came, or are held: no wait
			if noted && st.Received != received {
				w.log.Info(w.what+": share group records delivered again", "share_group", group, "waited", now.Sub(since).Round(time.Second))
			}
			received, since, noted = st.Received, now, false
			continue
		}
		if (!noted && now.Sub(since) < joinNote) || (noted && now.Before(next)) {
			continue
		}
		if _, bad := w.unreachable(); bad { // the broker warnings say why
			continue
		}
		b, ok := w.shareBacklog(ctx, group)
		switch {
		case !ok:
		case b.waiting == 0 && noted:
			w.log.Info(w.what+": no records wait in the share group any more (other members took them)", "share_group", group, "waited", now.Sub(since).Round(time.Second))
			since, noted = now, false
		case b.waiting == 0:
		case !noted:
			w.log.Warn(w.what+": no records delivered while the share group has records waiting: it is likely waiting for a member that stopped without leaving (kill -9, a crash, an OOM kill), whose share partitions stay assigned to it until its share session expires, and the records it acquired locked until then or until their locks expire; or other members take every record",
				"share_group", group, "waited", now.Sub(since).Round(time.Second), "waiting_records", b.waiting,
				"at_most", b.atMost(),
				"shorter_next_time", "stop members with SIGTERM (a member that leaves gives back its partitions and releases its records at once), or a shorter share session timeout: group.share.session.timeout.ms on the brokers or share.session.timeout.ms on the group (kpar broker --share-session-timeout)",
				"members", b.members)
			noted = true
			next = now.Add(joinReport)
		default:
			w.log.Warn(w.what+": still no records delivered while the share group has records waiting",
				"share_group", group, "waited", now.Sub(since).Round(time.Second), "waiting_records", b.waiting, "members", b.members)
			next = now.Add(joinReport)
		}
	}
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
