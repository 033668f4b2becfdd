package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/internal/testkit"
)

// TestReadinessListsOffsetsOncePerSample: an idle member owning some of
// the consumed partitions lists the end offsets and the group's committed
// offsets once for its lag and for the partitions it does not own: the
// broker sees one ListOffsets and one OffsetFetch request a listing,
// counted over ten samples driven one by one (no clock involved).
func TestReadinessListsOffsetsOncePerSample(t *testing.T) {
	const samples = 10
	for _, tc := range []struct {
		name                     string
		grace                    time.Duration
		committed                int32 // partitions 0 to committed-1 of 3 have a commit
		listOffsets, offsetFetch int64
		waiting                  int64
	}{
		// Before one listing served both: 20 and 20, 4 and 4, 40 and 20.
		{"a 1s grace lists at every sample", time.Second, 3, samples, samples, 3 + 3},
		{"the default 15s grace lists every 5s", defaultReadyStall, 3, 2, 2, 3 + 3},
		{"partitions never committed have their start offsets listed once too", time.Second, 1, 2 * samples, samples, 3 + 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testkit.Context(t, time.Minute)
			c := testkit.Cluster(t, kfake.SeedTopics(3, "t"))
			var listOffsets, offsetFetch atomic.Int64
			count := func(n *atomic.Int64) func(kmsg.Request) (kmsg.Response, error, bool) {
				return func(kmsg.Request) (kmsg.Response, error, bool) {
					n.Add(1)
					return nil, nil, false // counted, then handled by the broker
				}
			}
			c.ControlKey(int16(kmsg.ListOffsets), count(&listOffsets))
			c.ControlKey(int16(kmsg.OffsetFetch), count(&offsetFetch))

			s := newStallWatch(tc.grace)
			committed := make(kadm.Offsets)
			for p := range tc.committed {
				committed.Add(kadm.Offset{Topic: "t", Partition: p, At: 1})
			}
			// The member's own listings (its commits, its start) come
			// before it returns records: wait for a record of every
			// partition, then count the sampler's only.
			cl := lagGroup(ctx, t, c, s, 3, 12, committed, kgo.DisableAutoCommit())
			polled := map[int32]bool{}
			for len(polled) < 3 {
				fs := cl.PollFetches(ctx)
				if err := ctx.Err(); err != nil {
					t.Fatalf("records polled from partitions %v only: %v", polled, err)
				}
				fs.EachRecord(func(r *kgo.Record) { polled[r.Partition] = true })
			}
			listOffsets.Store(0)
			offsetFetch.Store(0)

			owned := []kpar.PartitionStats{{Topic: "t", Partition: 0}, {Topic: "t", Partition: 1}}
			w := s.clientWork(func() []kpar.PartitionStats { return owned }, func() (kpar.ShareStats, bool) { return kpar.ShareStats{}, false })
			smp := &sampler{p: s, w: w, seen: -1}
			start := time.Now()
			for i := range samples {
				smp.sample(ctx, start.Add(time.Duration(i)*sampleInterval))
			}
			lo, of := listOffsets.Load(), offsetFetch.Load()
			t.Logf("%d samples, grace %v: %d ListOffsets, %d OffsetFetch", samples, tc.grace, lo, of)
			if lo != tc.listOffsets || of != tc.offsetFetch {
				t.Errorf("%d ListOffsets and %d OffsetFetch requests, want %d and %d", lo, of, tc.listOffsets, tc.offsetFetch)
			}
			if s.st.waiting != tc.waiting {
				t.Errorf("%d records waiting on partitions 0 and 1, want %d", s.st.waiting, tc.waiting)
			}
		})
	}
}

// TestReadinessSharesEachListing: the lag and the unowned partitions, each
// due every orphanInterval, share each listing. An idle member lists once
// an interval, not twice; one holding records lists for the unowned
// partitions only and keeps no lag from it, so that it lists again as soon
// as it holds nothing, then once an interval again; a listing that found
// no lag is tried again at the next sample; a share-group member holding
// records lists nothing. Samples driven one by one (no clock involved).
func TestReadinessSharesEachListing(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	w := &fakeWork{unowned: &fakeUnowned{}}
	var (
		lists    int
		lagFails bool
	)
	work := w.work()
	list := work.list
	work.list = func(ctx context.Context, owned []kpar.PartitionStats) listing {
		lists++
		l := list(ctx, owned)
		l.lagKnown = !lagFails
		return l
	}
	s := newStallWatch(2 * time.Second) // listed every 2s
	smp := &sampler{p: s, w: work, seen: -1}
	start := time.Now()
	sample := func(from, to int, when string, wantLists int) {
		t.Helper()
		for sec := from; sec <= to; sec++ {
			smp.sample(ctx, start.Add(time.Duration(sec)*time.Second))
		}
		if lists != wantLists {
			t.Errorf("%s: %d listings by second %d, want %d", when, lists, to, wantLists)
		}
	}

	sample(0, 9, "idle", 5)
	w.held.Store(5)
	w.lag.Store(99) // what is held is not committed yet
	sample(10, 12, "records held", 7)
	w.held.Store(0)
	w.lag.Store(0)
	sample(13, 13, "holding nothing again", 8)
	if s.st.waiting != 0 {
		t.Errorf("%d records waiting once nothing is held, want 0: the lag listed while records were held was kept", s.st.waiting)
	}
	sample(14, 15, "idle, the two in phase", 9)
	lagFails = true
	sample(16, 18, "the listing fails", 11)
	lagFails = false
	sample(19, 21, "the listing works again", 13)
	w.share.Store(true)
	w.held.Store(3)
	sample(22, 30, "a share-group member holding records", 13)
}

// TestStallWatchKnowsNoLagWithNothingAssigned: a member assigned nothing
// has no lag, known even when the listing fails (the broker refuses the
// group's offsets), while the unowned partitions are then unknown.
func TestStallWatchKnowsNoLagWithNothingAssigned(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	c := testkit.Cluster(t, kfake.SeedTopics(2, "t"))
	s := newStallWatch(time.Minute)
	lagGroup(ctx, t, c, s, 2, 4, kadm.OffsetsFromRecords(kgo.Record{Topic: "t", Partition: 0, Offset: 0}))
	c.ControlKey(int16(kmsg.OffsetFetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := req.ResponseKind().(*kmsg.OffsetFetchResponse)
		resp.Version = req.GetVersion()
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		for _, g := range req.(*kmsg.OffsetFetchRequest).Groups {
			rg := kmsg.NewOffsetFetchResponseGroup()
			rg.Group, rg.ErrorCode = g.Group, kerr.GroupAuthorizationFailed.Code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp, nil, true
	})
	if l := s.list(ctx, nil); !l.lagKnown || l.lag != 0 || l.unownedKnown {
		t.Errorf("nothing assigned, the group's offsets refused: %+v, want no lag, known, and the unowned partitions unknown", l)
	}
	if l := s.list(ctx, []kpar.PartitionStats{{Topic: "t", Partition: 0}}); l.lagKnown {
		t.Errorf("partition 0 assigned, the group's offsets refused: lag %d known, want unknown", l.lag)
	}
}
