package bench

import (
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// tracker counts what a run handled. In exact mode it keeps one bit per
// offset, so it knows distinct records, duplicates and, after a crash,
// the records never handled; otherwise (the memory scenario, whose backlog
// must not grow the consumer's own memory) it only counts.
//
// The handler path is one atomic OR (or add) per record on per-partition
// memory, the same cost for every contender.
type tracker struct {
	exact  bool
	parts  []partTrack
	target int64 // records the run waits for

	// frozen: the consumer counts as killed; completions no longer count.
	frozen atomic.Bool
	// skip: the measurement is over; handlers skip their work so the
	// contender shuts down fast.
	skip atomic.Bool
	dups atomic.Int64

	// Sleeps: how many, how long they were asked to be, how long they took.
	sleeps, asked, slept atomic.Int64

	// Latency sampling: records whose offset&mask == 0 are stamped when
	// the client buffers them (stampHook) and timed when handled.
	mask    int64
	latency bool // the contender's client stamps records (franz-go ones do)
	latMu   sync.Mutex
	lat     []time.Duration // guarded by latMu
}

type partTrack struct {
	bits  []atomic.Uint64 // exact: bit o set once offset o was handled
	end   int64
	count atomic.Int64 // !exact: records handled
	_     [56]byte     // keep partitions' counters off each other's cache lines

	// Owned by the goroutine that calls distinct: the words below full
	// are all ones, worth fullN records.
	full  int
	fullN int64
}

func newTracker(t *topic, exact bool, target int64) *tracker {
	tr := &tracker{exact: exact, parts: make([]partTrack, t.partitions), target: target}
	for p, end := range t.ends {
		tr.parts[p].end = end
		if exact {
			tr.parts[p].bits = make([]atomic.Uint64, (end+63)/64)
		}
	}
	// About 16k latency samples whatever the run's size.
	tr.mask = 0
	for (t.total / (tr.mask + 1)) > 1<<14 {
		tr.mask = tr.mask<<1 | 1
	}
	return tr
}

// handled counts r as handled (unless the consumer counts as killed).
func (t *tracker) handled(r *kgo.Record) {
	if t.frozen.Load() {
		return
	}
	p := &t.parts[r.Partition]
	if t.exact {
		if r.Offset >= p.end {
			return
		}
		bit := uint64(1) << (r.Offset & 63)
		if p.bits[r.Offset>>6].Or(bit)&bit != 0 {
			t.dups.Add(1)
		}
	} else {
		p.count.Add(1)
	}
	if t.latency && r.Offset&t.mask == 0 {
		d := time.Since(r.Timestamp)
		t.latMu.Lock()
		t.lat = append(t.lat, d)
		t.latMu.Unlock()
	}
}

// sleep sleeps d and accounts for it.
func (t *tracker) sleep(d time.Duration) {
	start := time.Now()
	time.Sleep(d)
	t.slept.Add(int64(time.Since(start)))
	t.asked.Add(int64(d))
	t.sleeps.Add(1)
}

// overshoot is how much longer than asked the run's sleeps took, on
// average, and the mean sleep; ok is false when nothing slept.
func (t *tracker) overshoot() (over, mean time.Duration, ok bool) {
	n := t.sleeps.Load()
	if n == 0 {
		return 0, 0, false
	}
	return time.Duration((t.slept.Load() - t.asked.Load()) / n), time.Duration(t.slept.Load() / n), true
}

// distinct returns how many distinct records were handled (in count mode,
// how many handlings). One goroutine calls it.
func (t *tracker) distinct() int64 {
	var n int64
	for i := range t.parts {
		p := &t.parts[i]
		if !t.exact {
			n += p.count.Load()
			continue
		}
		p.advance()
		n += p.fullN
		for w := p.full; w < len(p.bits); w++ {
			n += int64(bits.OnesCount64(p.bits[w].Load()))
		}
	}
	return n
}

// advance moves full past the words that are all ones now. Owned by the
// goroutine that calls distinct.
func (p *partTrack) advance() {
	for p.full < len(p.bits) {
		want := ^uint64(0)
		if p.full == len(p.bits)-1 && p.end%64 != 0 {
			want = 1<<(p.end%64) - 1
		}
		if p.bits[p.full].Load() != want {
			break
		}
		p.fullN += int64(bits.OnesCount64(want))
		p.full++
	}
}

// highest returns each partition's highest offset handled so far, -1 for
// none (exact trackers only).
func (t *tracker) highest() []int64 {
	hi := make([]int64, len(t.parts))
	for i := range t.parts {
		p := &t.parts[i]
		hi[i] = -1
		for w := len(p.bits) - 1; w >= 0; w-- {
			if v := p.bits[w].Load(); v != 0 {
				hi[i] = int64(w)*64 + int64(63-bits.LeadingZeros64(v))
				break
			}
		}
	}
	return hi
}

// handledThrough reports whether every offset of every partition p up to
// upto[p] was handled (exact trackers only). Like distinct, one goroutine
// calls it.
func (t *tracker) handledThrough(upto []int64) bool {
	for i := range t.parts {
		p := &t.parts[i]
		if upto[i] < 0 {
			continue
		}
		p.advance()
		w := upto[i] >> 6
		if int64(p.full) > w {
			continue
		}
		if int64(p.full) < w {
			return false
		}
		want := ^uint64(0) >> (63 - upto[i]&63) // bits 0 to upto's
		if p.bits[w].Load()&want != want {
			return false
		}
	}
	return true
}

// percentiles returns the p50 and p99 of the sampled latencies, and false
// when there are none.
func (t *tracker) percentiles() (p50, p99 time.Duration, ok bool) {
	t.latMu.Lock()
	lat := slices.Clone(t.lat)
	t.latMu.Unlock()
	if len(lat) == 0 {
		return 0, 0, false
	}
	slices.Sort(lat)
	at := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	return at(0.50), at(0.99), true
}

// stampHook stamps sampled records with the time the client buffered them,
// in their Timestamp field, which nothing else in the run reads. It runs
// in the client's fetch path before a record can be polled.
type stampHook struct{ mask int64 }

func (h stampHook) OnFetchRecordBuffered(r *kgo.Record) {
	if r.Offset&h.mask == 0 {
		r.Timestamp = time.Now()
	}
}

var _ kgo.HookFetchRecordBuffered = stampHook{}
