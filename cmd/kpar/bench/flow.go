package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/internal/ledger"
)

// The flow scenarios put an HTTP endpoint in this process and forward to
// it as `kpar forward` does (kpar.New with a forward.Handler, the CLI's
// defaults: 3 attempts, 100ms backoff, 10s attempt timeout, commits every
// 2ms, key order), beside a plain Go HTTP load generator where the figure
// needs one. They are the figures of issue 10:
//
//	adaptive  an endpoint that answers 429 at once beyond 16 requests in
//	          flight and takes 5ms otherwise: --adaptive at concurrency
//	          256 vs a fixed 256; dead letters, lost, rate / capacity
//	rate      RateLimit(500, 50) (--rate-limit 500) on 3,000 records: the
//	          most starts in any one second, and the wall time / 6s
//	forward   per-record forwarding vs the load generator, same endpoint
//	          (5ms), same concurrency (256), same run
//	batch     --batch 100 (concurrency 800, the CLI's 8 x batch) vs the
//	          load generator's per-record rate
const (
	flowService  = 5 * time.Millisecond
	flowCapacity = 16
	flowTimeout  = 10 * time.Second
	flowKeys     = 10_000
)

// Contenders of the flow scenarios: --contenders does not apply to them.
const (
	KparForward = "kpar-forward"
	Generator   = "generator"
)

// endpoint is an in-process HTTP endpoint on loopback.
type endpoint struct {
	url      string
	srv      *http.Server
	inflight atomic.Int64
	rejected atomic.Int64
	requests atomic.Int64
	mu       sync.Mutex
	arrivals []time.Time // when recorded
	record   bool
}

// newEndpoint serves: beyond capacity requests in flight (0: no limit) it
// answers 429 at once, else it reads the body and answers 200 after
// service.
func newEndpoint(service time.Duration, capacity int64, record bool) (*endpoint, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ep := &endpoint{url: "http://" + ln.Addr().String() + "/", record: record}
	ep.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep.requests.Add(1)
		if ep.record {
			now := time.Now()
			ep.mu.Lock()
			ep.arrivals = append(ep.arrivals, now)
			ep.mu.Unlock()
		}
		n := ep.inflight.Add(1)
		defer ep.inflight.Add(-1)
		if capacity > 0 && n > capacity {
			w.WriteHeader(http.StatusTooManyRequests)
			ep.rejected.Add(1)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		if service > 0 {
			time.Sleep(service) // the endpoint's own work
		}
	})}
	go ep.srv.Serve(ln)
	return ep, nil
}

func (ep *endpoint) close() { ep.srv.Close() }

// letters is a dead-letter sink that counts and passes each letter's record
// to done (so that a run ends when every record is delivered or dead).
type letters struct {
	n    atomic.Int64
	done func(*kgo.Record)
}

func (l *letters) Write(_ context.Context, ls []deadletter.Letter) error {
	for _, x := range ls {
		l.n.Add(1)
		l.done(x.Record)
	}
	return nil
}

// forwardContender is `kpar forward` in this process: a kpar consumer
// whose handler is a forward.Handler to url, counting a record as handled
// once the endpoint took it. delivered counts those; sink gets the dead
// letters.
func forwardContender(name, url string, fopts []forward.Opt, kopts []kpar.ConsumerOpt, sink *letters, delivered *atomic.Int64) contender {
	return contender{name: name, members: one, stamps: true, run: func(ctx context.Context, e *env) error {
		h, err := forward.New(url, append([]forward.Opt{forward.Concurrency(e.concurrency), forward.Timeout(flowTimeout)}, fopts...)...)
		if err != nil {
			return err
		}
		defer h.CloseIdleConnections()
		sink.done = func(r *kgo.Record) { _ = e.handle(ctx, r) }
		opts := append([]kpar.ConsumerOpt{
			kpar.Brokers(e.brokers...),
			kpar.Group(e.group),
			kpar.Topics(e.topic),
			kpar.Concurrency(e.concurrency),
			kpar.ClientOptions(e.kgoOpts...),
			kpar.CommitInterval(2 * time.Millisecond),
			kpar.AttemptTimeout(flowTimeout),
			kpar.DeadLetters(sink),
		}, kopts...)
		c, err := kpar.New(kpar.HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
			if err := h.Handle(ctx, r); err != nil {
				return err
			}
			delivered.Add(1)
			return e.handle(ctx, r)
		}), opts...)
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}}
}

// runForward measures one forwardContender on t.
func (r *runner) runForward(ctx context.Context, scenario, variant string, t *topic, url string, conc int,
	fopts []forward.Opt, kopts ...kpar.ConsumerOpt) (Result, int64, int64) {
	var delivered atomic.Int64
	sink := &letters{done: func(*kgo.Record) {}}
	c := forwardContender(KparForward, url, fopts, kopts, sink, &delivered)
	res := r.measure(ctx, runSpec{scenario: scenario, variant: variant, c: c, t: t, work: noWork, concurrency: conc, commitEvery: 2 * time.Millisecond})
	return res, delivered.Load(), sink.n.Load()
}

// generate is the plain Go HTTP client a user would write: conc goroutines
// POSTing body n times in all with a pooled client, draining each answer.
// Like a kpar run, it has its CPU time measured (Cores) and, with
// --cpuprofile, profiled, so that the two compare per request.
func (r *runner) generate(ctx context.Context, scenario, url string, conc int, n int64, body []byte) Result {
	res := Result{Scenario: scenario, Contender: Generator, Target: n}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = conc, conc
	cl := &http.Client{Transport: t}
	defer cl.CloseIdleConnections()
	var left, done, failed atomic.Int64
	left.Store(n)
	var wg sync.WaitGroup
	runtime.GC() // as measure does: every run starts from a collected heap
	stopProfile := r.startProfile(runSpec{scenario: scenario, variant: "per request", c: contender{name: Generator}})
	cpu0 := cpuTime()
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for left.Add(-1) >= 0 && ctx.Err() == nil {
				resp, err := cl.Post(url, "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				done.Add(1)
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	cpu := cpuTime() - cpu0
	stopProfile()
	res.Records, res.Seconds = done.Load(), wall.Seconds()
	res.RecordsPerSec = float64(res.Records) / wall.Seconds()
	res.Cores = cpu.Seconds() / wall.Seconds()
	if f := failed.Load(); f > 0 {
		res.Err = fmt.Sprintf("%d requests failed", f)
	}
	r.progressf("%s %s: %s requests/s%s", scenario, Generator, commas(int64(res.RecordsPerSec)), errSuffix(res))
	return res
}

func (r *runner) flowTopic(ctx context.Context, name string, def int) (*topic, error) {
	return r.topic(ctx, name, r.cfg.Partitions, flowKeys, r.cfg.ValueBytes, r.records(def))
}

// flowEndpoint is flowTopic and an endpoint without a capacity limit (see
// newEndpoint) for it; the caller closes the endpoint.
func (r *runner) flowEndpoint(ctx context.Context, name string, def int, service time.Duration, record bool) (*topic, *endpoint, error) {
	t, err := r.flowTopic(ctx, name, def)
	if err != nil {
		return nil, nil, err
	}
	ep, err := newEndpoint(service, 0, record)
	if err != nil {
		return nil, nil, err
	}
	return t, ep, nil
}

// ---- adaptive ----

func (r *runner) adaptive(ctx context.Context) ([]Result, error) {
	t, err := r.flowTopic(ctx, "flow-adaptive", 10_000)
	if err != nil {
		return nil, err
	}
	capacity := float64(flowCapacity) / flowService.Seconds()
	var out []Result
	for _, v := range []struct {
		name string
		opts []kpar.ConsumerOpt
	}{
		{"--adaptive", []kpar.ConsumerOpt{kpar.AdaptiveConcurrency()}},
		{"fixed 256", nil},
	} {
		ep, err := newEndpoint(flowService, flowCapacity, false)
		if err != nil {
			return out, err
		}
		res, delivered, dead := r.runForward(ctx, Adaptive, v.name, t, ep.url, 256, nil, v.opts...)
		ep.close()
		res.Lost = max(0, res.Target-delivered-dead)
		rate := float64(delivered) / res.Seconds
		res.Ratio, res.RatioTo = rate/capacity, "capacity"
		res.Note = join(res.Note, fmt.Sprintf("delivered %s (%s/s), dead letters %s, 429s %s (%.2f per record); capacity %d in flight / %s = %s/s",
			commas(delivered), commas(int64(rate)), commas(dead), commas(ep.rejected.Load()), float64(ep.rejected.Load())/float64(max(delivered, 1)), flowCapacity, flowService, commas(int64(capacity))))
		out = append(out, res)
		if ctx.Err() != nil {
			break
		}
	}
	return out, ctx.Err()
}

// ---- rate ----

const (
	flowRate      = 500
	flowRateBurst = 50 // kpar forward's default: a tenth of a second's worth
)

func (r *runner) rate(ctx context.Context) ([]Result, error) {
	t, ep, err := r.flowEndpoint(ctx, "flow-rate", 3_000, 0, true)
	if err != nil {
		return nil, err
	}
	defer ep.close()
	res, _, dead := r.runForward(ctx, Rate, fmt.Sprintf("--rate-limit %d", flowRate), t, ep.url, 64, nil,
		kpar.RateLimit(flowRate, flowRateBurst))
	ep.mu.Lock()
	arrivals := slices.Clone(ep.arrivals)
	ep.mu.Unlock()
	ideal := float64(t.total) / flowRate
	most := ledger.MaxInWindow(arrivals, time.Second)
	res.Ratio, res.RatioTo = res.Seconds/ideal, fmt.Sprintf("%.0fs", ideal)
	res.Note = join(res.Note, fmt.Sprintf("most requests in any 1s: %s (rate %d, burst %d); %s requests; dead letters %s",
		commas(int64(most)), flowRate, flowRateBurst, commas(int64(len(arrivals))), commas(dead)))
	return []Result{res}, ctx.Err()
}

// ---- forward, batch ----

func (r *runner) forward(ctx context.Context) ([]Result, error) {
	t, ep, err := r.flowEndpoint(ctx, "flow-forward", 30_000, flowService, false)
	if err != nil {
		return nil, err
	}
	defer ep.close()
	const conc = 256
	var dead int64
	gen, res, err := r.againstGenerator(ctx, Forward, ep, conc, t.total, func() Result {
		res, _, d := r.runForward(ctx, Forward, "per record", t, ep.url, conc, nil)
		dead += d
		return res
	})
	if err != nil {
		return nil, err
	}
	ideal := float64(conc) / flowService.Seconds()
	gen.Ratio, gen.RatioTo = gen.RecordsPerSec/ideal, "ideal"
	gen.Note = join(fmt.Sprintf("%d goroutines POSTing %d-byte bodies; ideal %s/s (%d / %s)", conc, r.cfg.ValueBytes, commas(int64(ideal)), conc, flowService), gen.Note)
	res.Note = join(res.Note, fmt.Sprintf("concurrency %d, endpoint %s per request; dead letters %s", conc, flowService, commas(dead)))
	return []Result{gen, res}, ctx.Err()
}

func (r *runner) batch(ctx context.Context) ([]Result, error) {
	t, ep, err := r.flowEndpoint(ctx, "flow-batch", 100_000, flowService, false)
	if err != nil {
		return nil, err
	}
	defer ep.close()
	const genConc, batch = 256, 100
	conc := 8 * batch // kpar forward's default with --batch
	var dead, requests int64
	gen, res, err := r.againstGenerator(ctx, Batch, ep, genConc, min(t.total, 30_000), func() Result {
		before := ep.requests.Load() // the generator's
		res, _, d := r.runForward(ctx, Batch, fmt.Sprintf("--batch %d", batch), t, ep.url, conc,
			[]forward.Opt{forward.Batch(batch, 5*time.Millisecond)})
		dead, requests = dead+d, requests+ep.requests.Load()-before
		return res
	})
	if err != nil {
		return nil, err
	}
	gen.Note = join(fmt.Sprintf("%d goroutines, one record per request", genConc), gen.Note)
	res.Note = join(res.Note, fmt.Sprintf("concurrency %d (8 batches of %d in flight), %s requests a run; dead letters %s",
		conc, batch, commas(requests/int64(r.cfg.Rounds)), commas(dead)))
	return []Result{gen, res}, ctx.Err()
}

// againstGenerator alternates, Rounds times (so that drift on a shared
// machine hits both alike), the load generator
// (genConc goroutines, n requests to ep) and one kpar run (run), and
// returns the median of each; the kpar run's ratio is to the generator's
// rate. err is ctx's once it ended.
func (r *runner) againstGenerator(ctx context.Context, scenario string, ep *endpoint, genConc int, n int64, run func() Result) (gen, res Result, err error) {
	body := bytes.Repeat([]byte{'x'}, r.cfg.ValueBytes)
	var gens, runs []Result
	for range r.cfg.Rounds {
		gens = append(gens, r.generate(ctx, scenario, ep.url, genConc, n, body))
		runs = append(runs, run())
		if ctx.Err() != nil {
			return Result{}, Result{}, ctx.Err()
		}
	}
	gen, res = median(gens), median(runs)
	gen.Variant = "per request"
	if gen.RecordsPerSec > 0 {
		res.Ratio, res.RatioTo = res.RecordsPerSec/gen.RecordsPerSec, "generator"
	}
	gen.Note = join(gen.Note, cpuPerRecord(gens, "request"))
	res.Note = join(res.Note, cpuPerRecord(runs, "record")+" (broker included)")
	return gen, res, nil
}

// cpuPerRecord is the median over rs of the process's CPU time per record
// (or request): on a machine with fewer cores than the work could use,
// records/s follow it.
func cpuPerRecord(rs []Result, per string) string {
	var us []float64
	for _, r := range rs {
		if r.Records > 0 {
			us = append(us, r.Cores*r.Seconds/float64(r.Records)*1e6)
		}
	}
	if len(us) == 0 {
		return ""
	}
	slices.Sort(us)
	return fmt.Sprintf("%.1f µs CPU/%s", us[len(us)/2], per)
}
