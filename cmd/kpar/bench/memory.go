package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The memory scenario's values are small, so the backlog is many records
// rather than many bytes: what must stay flat is per-record state.
const memoryValueBytes = 16

func (r *runner) memory(ctx context.Context) ([]Result, error) {
	cs := r.contenders(Raw, KparKey, KparPartition, KparUnordered)
	if len(cs) == 0 {
		return nil, nil
	}
	// Every backlog at the first partition count; the first backlog
	// again at each further count, for the slope of memory over
	// partitions.
	counts := r.cfg.partitionsFor(Memory)
	var (
		out   []Result
		parts []int // out[i]'s partition count
	)
	for ci, n := range counts {
		t, err := r.b.createTopic(ctx, fmt.Sprintf("memory-%dp", n), n, 100_000, memoryValueBytes)
		if err != nil {
			return out, err
		}
		backlogs := r.cfg.Backlogs
		if ci > 0 {
			backlogs = backlogs[:1]
		}
		for _, backlog := range backlogs {
			// Grow the topic to the backlog; each run's fresh group
			// starts at offset 0 and so faces all of it.
			if more := int64(backlog) - t.total; more > 0 {
				start := time.Now()
				if err := r.b.load(ctx, t, more); err != nil {
					return out, err
				}
				r.progressf("loaded %s: %s records in %s", t.name, commas(t.total), time.Since(start).Round(time.Millisecond))
			}
			variant := fmt.Sprintf("backlog %s", commas(t.total))
			if len(counts) > 1 || n != DefaultConfig().Partitions {
				variant = fmt.Sprintf("%s partitions, %s", commas(int64(n)), variant)
			}
			for _, c := range cs {
				var res Result
				if r.cfg.Spawn != nil {
					res = r.measureChild(ctx, c, t, variant)
				} else {
					res = r.measureHeap(ctx, c, t, variant)
				}
				out, parts = append(out, res), append(parts, n)
				if ctx.Err() != nil {
					return out, ctx.Err()
				}
			}
		}
	}
	// Ratio to the smallest backlog, per contender and partition count.
	for i := range out {
		res := &out[i]
		for j := range out {
			first := &out[j]
			if first.Contender != res.Contender || parts[j] != parts[i] || first.Err != "" {
				continue
			}
			switch {
			case res.PeakRSS > 0 && first.PeakRSS > 0:
				res.Ratio, res.RatioTo = float64(res.PeakRSS)/float64(first.PeakRSS), "first backlog"
			case res.PeakHeap > 0 && first.PeakHeap > 0:
				res.Ratio, res.RatioTo = float64(res.PeakHeap)/float64(first.PeakHeap), "first backlog"
			}
			break
		}
	}
	if len(counts) > 1 {
		perPartition(out, parts, r.cfg.Backlogs[0])
	}
	return out, nil
}

// perPartition sets, on each contender's runs at the first backlog, the
// least-squares slope of peak RSS (of peak heap in process) over the
// partition count.
func perPartition(out []Result, parts []int, backlog int) {
	type point struct{ x, y float64 }
	pts := map[string][]point{}
	rows := map[string][]int{}
	for i, res := range out {
		if res.Err != "" || res.Target != int64(backlog) {
			continue
		}
		y := res.PeakRSS
		if y <= 0 {
			y = res.PeakHeap
		}
		pts[res.Contender] = append(pts[res.Contender], point{float64(parts[i]), float64(y)})
		rows[res.Contender] = append(rows[res.Contender], i)
	}
	for c, ps := range pts {
		if len(ps) < 2 {
			continue
		}
		var mx, my float64
		for _, p := range ps {
			mx += p.x
			my += p.y
		}
		mx, my = mx/float64(len(ps)), my/float64(len(ps))
		var sxy, sxx float64
		for _, p := range ps {
			sxy += (p.x - mx) * (p.y - my)
			sxx += (p.x - mx) * (p.x - mx)
		}
		if sxx == 0 {
			continue
		}
		slope := sxy / sxx
		what := "RSS"
		if out[rows[c][0]].PeakRSS <= 0 {
			what = "heap"
		}
		note := fmt.Sprintf("%s per partition %.1f KiB (slope over %s–%s partitions at backlog %s)",
			what, slope/1024, commas(int64(ps[0].x)), commas(int64(ps[len(ps)-1].x)), commas(int64(backlog)))
		for _, i := range rows[c] {
			if what == "RSS" {
				out[i].RSSPerPartition = int64(slope)
			}
			out[i].Note = join(out[i].Note, note)
		}
	}
}

// measureHeap is the in-process fallback: peak heap only (RSS would
// include the broker and every earlier run).
func (r *runner) measureHeap(ctx context.Context, c contender, t *topic, variant string) Result {
	hs := startHeapSampler(nil)
	res := r.measureCounting(ctx, c, t, variant)
	res.PeakHeap = hs.stop()
	res.Note = join(res.Note, "in-process: peak heap includes the broker")
	return res
}

// measureCounting is measure with a counting tracker, whose memory does
// not grow with the backlog.
func (r *runner) measureCounting(ctx context.Context, c contender, t *topic, variant string) Result {
	s := runSpec{scenario: Memory, variant: variant, c: c, t: t, work: noWork, concurrency: defaultConcurrency}
	res := Result{Scenario: Memory, Variant: variant, Contender: c.name, Target: t.total}
	tr := newTracker(t, false, t.total)
	tr.latency = c.stamps
	group := r.group(Memory, c.name)
	e := r.env(&s, tr, group)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.run(cctx, e) }()
	t0 := time.Now()
	n, st, err := r.watch(ctx, tr, t0, 0, errc, nil)
	wall := time.Since(t0)
	tr.skip.Store(true)
	cancel()
	if st != stContenderStopped {
		select {
		case err = <-errc:
		case <-time.After(stopTimeout):
			err = fmt.Errorf("did not stop within %s", stopTimeout)
		}
	}
	res.Records, res.Seconds, res.RecordsPerSec = n, wall.Seconds(), float64(n)/wall.Seconds()
	if p50, p99, ok := tr.percentiles(); ok {
		res.P50Ms, res.P99Ms = ms(p50), ms(p99)
	}
	if st != stDone {
		res.Err = fmt.Sprintf("stopped with %s of %s handled: %v", commas(n), commas(t.total), err)
	}
	r.progressf("memory %s %s: %s records/s%s", variant, c.name, commas(int64(res.RecordsPerSec)), errSuffix(res))
	return res
}

// childSpec is what the parent sends a child on stdin.
type childSpec struct {
	Broker     string  `json:"broker"`
	Topic      string  `json:"topic"`
	Ends       []int64 `json:"ends"`
	Group      string  `json:"group"`
	Contender  string  `json:"contender"`
	Concurrent int     `json:"concurrency"`
	// FetchMaxWait is Config.FetchMaxWait in nanoseconds (0: defaults).
	FetchMaxWait time.Duration `json:"fetch_max_wait_ns,omitempty"`
}

// childResult is what a child prints on stdout.
type childResult struct {
	Handled  int64  `json:"handled"`
	EndNanos int64  `json:"end_unix_nano"`
	PeakRSS  int64  `json:"peak_rss_bytes"`
	PeakHeap int64  `json:"peak_heap_bytes"`
	P50Nanos int64  `json:"p50_ns"`
	P99Nanos int64  `json:"p99_ns"`
	Latency  bool   `json:"latency"`
	Err      string `json:"error,omitempty"`
}

// measureChild runs c in a child process (Config.Spawn): the broker and
// this process's earlier runs stay out of the child's peak RSS.
func (r *runner) measureChild(ctx context.Context, c contender, t *topic, variant string) Result {
	res := Result{Scenario: Memory, Variant: variant, Contender: c.name, Target: t.total}
	group := r.group(Memory, c.name)
	spec, _ := json.Marshal(childSpec{Broker: r.b.addr, Topic: t.name, Ends: t.ends, Group: group,
		Contender: c.name, Concurrent: defaultConcurrency, FetchMaxWait: r.cfg.FetchMaxWait})

	g, err := r.b.closeGate()
	defer g.open()
	if err != nil {
		res.Err = err.Error()
		return res
	}
	cctx, cancel := context.WithTimeout(ctx, runLimit)
	defer cancel()
	cmd := r.cfg.Spawn(cctx)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(spec), &stdout, &stderr
	if err := cmd.Start(); err != nil {
		res.Err = "starting the child: " + err.Error()
		return res
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	sctx, scancel := context.WithTimeout(ctx, settleTimeout)
	err = r.b.waitStable(sctx, group, c.members(t.partitions), t, exited)
	scancel()
	if err != nil {
		res.Err = err.Error() + childStderr(&stderr)
		cancel()
		g.open()
		<-exited
		return res
	}
	t0 := time.Now()
	g.open()
	if g.openErr != nil {
		res.Err = g.openErr.Error()
		cancel()
		<-exited
		return res
	}
	if err := <-exited; err != nil {
		res.Err = fmt.Sprintf("child: %v%s", err, childStderr(&stderr))
		return res
	}
	var cr childResult
	if err := json.Unmarshal(stdout.Bytes(), &cr); err != nil {
		res.Err = fmt.Sprintf("child output: %v%s", err, childStderr(&stderr))
		return res
	}
	wall := time.Unix(0, cr.EndNanos).Sub(t0)
	res.Records, res.Seconds, res.RecordsPerSec = cr.Handled, wall.Seconds(), float64(cr.Handled)/wall.Seconds()
	res.PeakRSS, res.PeakHeap = cr.PeakRSS, cr.PeakHeap
	if cr.Latency {
		res.P50Ms, res.P99Ms = ms(time.Duration(cr.P50Nanos)), ms(time.Duration(cr.P99Nanos))
	}
	res.Err = cr.Err
	r.progressf("memory %s %s: peak RSS %s, peak heap %s%s", variant, c.name, mib(res.PeakRSS), mib(res.PeakHeap), errSuffix(res))
	return res
}

func childStderr(b *bytes.Buffer) string {
	s := strings.TrimSpace(b.String())
	if s == "" {
		return ""
	}
	if len(s) > 500 {
		s = s[len(s)-500:]
	}
	return ": " + s
}

// ServeChild is the child side of Config.Spawn: it reads a run from in,
// consumes the parent's topic until every record was handled, and writes
// the result — with this process's peak RSS and peak heap — to out.
func ServeChild(ctx context.Context, in io.Reader, out io.Writer) error {
	var spec childSpec
	if err := json.NewDecoder(in).Decode(&spec); err != nil {
		return fmt.Errorf("bench child: reading the run: %w", err)
	}
	c, ok := contenderNamed(spec.Contender)
	if !ok {
		return fmt.Errorf("bench child: unknown contender %q", spec.Contender)
	}
	t := &topic{name: spec.Topic, partitions: len(spec.Ends), ends: spec.Ends}
	for _, e := range spec.Ends {
		t.total += e
	}
	hs := startHeapSampler(newHeapProfiler(spec.Contender))
	r := &runner{b: &broker{addr: spec.Broker}, cfg: Config{FetchMaxWait: spec.FetchMaxWait}}
	s := runSpec{scenario: Memory, c: c, t: t, work: noWork, concurrency: spec.Concurrent}
	tr := newTracker(t, false, t.total)
	tr.latency = c.stamps
	e := r.env(&s, tr, spec.Group)

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.run(cctx, e) }()
	n, st, err := r.watch(ctx, tr, time.Now(), 0, errc, nil)
	end := time.Now()
	tr.skip.Store(true)
	cancel()
	if st != stContenderStopped {
		err = <-errc
	}
	cr := childResult{Handled: n, EndNanos: end.UnixNano(), PeakHeap: hs.stop(), PeakRSS: peakRSS()}
	if p50, p99, ok := tr.percentiles(); ok {
		cr.P50Nanos, cr.P99Nanos, cr.Latency = int64(p50), int64(p99), true
	}
	if st != stDone {
		cr.Err = fmt.Sprintf("stopped with %s of %s handled: %v", commas(n), commas(t.total), err)
	}
	return json.NewEncoder(out).Encode(cr)
}

// peakRSS reads VmHWM, the process's peak resident set, from
// /proc/self/status (0 where there is none).
func peakRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// heapSampler samples HeapInuse (heap objects plus heap spans' unused
// bytes, runtime/metrics) every 10ms and keeps the peak.
type heapSampler struct {
	peak atomic.Int64
	prof *heapProfiler // nil unless KPAR_BENCH_HEAPPROFILE is set
	done chan struct{}
	wg   sync.WaitGroup
}

func startHeapSampler(prof *heapProfiler) *heapSampler {
	h := &heapSampler{done: make(chan struct{}), prof: prof}
	h.sample()
	h.wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-h.done:
				return
			case <-t.C:
				h.sample()
			}
		}
	})
	return h
}

func (h *heapSampler) sample() {
	s := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
	}
	metrics.Read(s)
	v := int64(s[0].Value.Uint64() + s[1].Value.Uint64())
	h.prof.observe(v)
	for cur := h.peak.Load(); v > cur && !h.peak.CompareAndSwap(cur, v); cur = h.peak.Load() {
	}
}

func (h *heapSampler) stop() int64 {
	close(h.done)
	h.wg.Wait()
	h.sample()
	return h.peak.Load()
}
