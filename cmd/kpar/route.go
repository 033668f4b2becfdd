package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/route"
)

// routeSummaryInterval is how often the log sums up what the filter and
// the routes did, when they did something.
const routeSummaryInterval = 10 * time.Second

// routeFlags are --filter and --route, which kpar forward and kpar backfill
// share: CEL expressions choosing which records are sent, and where (package
// route; docs/cli.md, "Filters and routes").
type routeFlags struct {
	filter *string
	routes listFlag
	// decoder, when set before endpoints (--schema-registry), decodes the
	// value and key that the expressions read, once per record, for the
	// forward.Handler too.
	decoder forward.Decoder
}

func addRouteFlags(fs *flagSet) *routeFlags {
	rf := &routeFlags{}
	rf.filter = fs.String("filter", "", "send only the records for which the CEL expression `EXPR` is true, such as 'value.type == \"order\"' (variables key, value, headers, topic, partition, offset, timestamp); the others finish without a request and are committed")
	fs.Var(&rf.routes, "route", "send the records for which the CEL expression EXPR is true to URL, `'EXPR -> URL'`; repeatable, the first that matches wins; --url takes the records no route matches, and without --url they are filtered")
	return rf
}

// routeSpec is one --route.
type routeSpec struct{ expr, url string }

// parse splits each --route at its last "->" (a URL has none).
func (rf *routeFlags) parse() ([]routeSpec, error) {
	var specs []routeSpec
	for i, v := range rf.routes.values {
		at := strings.LastIndex(v, "->")
		if at < 0 {
			return nil, fmt.Errorf("invalid --route %d %q: want 'EXPR -> URL'", i+1, v)
		}
		expr, u := strings.TrimSpace(v[:at]), strings.TrimSpace(v[at+2:])
		switch {
		case expr == "":
			return nil, fmt.Errorf("invalid --route %d %q: no expression before ->", i+1, v)
		case u == "":
			return nil, fmt.Errorf("invalid --route %d %q: no URL after ->", i+1, v)
		}
		specs = append(specs, routeSpec{expr, u})
	}
	return specs, nil
}

// checkTarget is the usage error of a command given neither --url nor
// --route, which parseArgs would otherwise report for a missing --url.
func (rf *routeFlags) checkTarget(fs *flagSet, target string) (code int, ok bool) {
	if strings.TrimSpace(target) == "" && len(rf.routes.values) == 0 {
		return fs.usageError("missing --url (or %s), or --route", envName("url")), false
	}
	return 0, true
}

// endpoints is what a command sends records to: the forward.Handler of
// --url and of each URL of --route (one per distinct URL, so that --batch
// batches per URL), and the route.Handler choosing among them. Without
// --filter and --route it is the --url handler alone.
type endpoints struct {
	handler  kpar.Handler
	fwds     []*forward.Handler
	router   *route.Handler // nil without --filter and --route
	filter   string
	specs    []routeSpec
	fallback string // --url, "" for none

	every time.Duration // of the summaries
	mu    sync.Mutex    // guards last
	last  route.Stats
}

// endpoints checks the flags and makes the handlers (forwarder's work for
// every URL): a bad URL or an expression that does not compile is a usage
// error naming its flag and position. contentType is --content-type, which
// says whether values without a content-type header are JSON.
func (rf *routeFlags) endpoints(fs *flagSet, target, contentType string, sec *securityOpts, opts ...forward.Opt) (*endpoints, []kgo.Opt, int, bool) {
	specs, err := rf.parse()
	if err != nil {
		return nil, nil, fs.usageError("%v", err), false
	}
	e := &endpoints{filter: *rf.filter, specs: specs, fallback: target}
	var secOpts []kgo.Opt
	var fallback kpar.Handler
	if target != "" {
		h, so, code, ok := fs.forwarder(target, sec, opts...)
		if !ok {
			return nil, nil, code, false
		}
		e.fwds, secOpts, fallback, e.handler = append(e.fwds, h), so, h, h
	}
	if *rf.filter == "" && len(specs) == 0 {
		return e, secOpts, 0, true
	}
	byURL := map[string]*forward.Handler{}
	if target != "" {
		byURL[target] = e.fwds[0]
	} else if secOpts, err = sec.kgoOpts(); err != nil {
		return nil, nil, fs.usageError("%v", err), false
	}
	rules := make([]route.Rule, len(specs))
	for i, s := range specs {
		h := byURL[s.url]
		if h == nil {
			if h, err = forward.New(s.url, opts...); err != nil {
				e.CloseIdleConnections()
				return nil, nil, fs.usageError("invalid --route %d URL: %v", i+1, strings.TrimPrefix(err.Error(), "forward: ")), false
			}
			byURL[s.url] = h
			e.fwds = append(e.fwds, h)
		}
		rules[i] = route.Rule{Expr: s.expr, Handler: h}
	}
	ropts := []route.Opt{route.Filter(*rf.filter), route.ContentType(contentType)}
	if rf.decoder != nil {
		ropts = append(ropts, route.Decoder(rf.decoder))
	}
	if e.router, err = route.New(rules, fallback, ropts...); err != nil {
		e.CloseIdleConnections()
		var ce *route.CompileError
		if errors.As(err, &ce) {
			flag := "--filter"
			if ce.Rule > 0 {
				flag = fmt.Sprintf("--route %d", ce.Rule)
			}
			return nil, nil, fs.usageError("invalid %s: %s", flag, ce.Detail), false
		}
		return nil, nil, fs.usageError("invalid --filter/--route: %v", strings.TrimPrefix(err.Error(), "route: ")), false
	}
	e.handler = e.router
	return e, secOpts, 0, true
}

// Handle sends r where the rules say.
func (e *endpoints) Handle(ctx context.Context, r *kgo.Record) error { return e.handler.Handle(ctx, r) }

// CloseIdleConnections closes every URL's idle connections.
func (e *endpoints) CloseIdleConnections() {
	for _, h := range e.fwds {
		h.CloseIdleConnections()
	}
}

// CheckTLS checks every https URL's certificate (forward.Handler.CheckTLS).
func (e *endpoints) CheckTLS(ctx context.Context) error {
	for _, h := range e.fwds {
		if err := h.CheckTLS(ctx); err != nil {
			return err
		}
	}
	return nil
}

// attrs are the start-up log's attributes of the filter and the routes.
func (e *endpoints) attrs() []any {
	var a []any
	if e.filter != "" {
		a = append(a, "filter", e.filter)
	}
	for i, s := range e.specs {
		a = append(a, "route_"+strconv.Itoa(i+1), s.expr+" -> "+redactURL(s.url))
	}
	if len(e.specs) > 0 && e.fallback == "" {
		a = append(a, "unrouted", "filtered (no --url)")
	}
	return a
}

// summarize logs, every interval in which something changed, what the
// filter and the routes did, and a warning for each expression that
// failed on records; the stop function it returns ends that and logs the
// totals. what names the command in the messages.
func (e *endpoints) summarize(log *slog.Logger, interval time.Duration, what string) (stop func()) {
	if e.router == nil {
		return func() {}
	}
	e.every = interval
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				e.logDelta(log, what, false)
			}
		}
	}()
	return func() {
		cancel()
		<-done
		e.logDelta(log, what, true)
	}
}

// logDelta logs what changed since the last call, or, when final, the
// totals (and the failures since the last call).
func (e *endpoints) logDelta(log *slog.Logger, what string, final bool) {
	st := e.router.Stats()
	e.mu.Lock()
	prev := e.last
	e.last = st
	e.mu.Unlock()
	zero := route.Stats{Rules: make([]route.ExprStats, len(st.Rules))}
	if prev.Rules == nil {
		prev = zero
	}
	changed := st.Filtered != prev.Filtered || st.Fallback != prev.Fallback || st.Filter.Matched != prev.Filter.Matched || st.Errors() != prev.Errors()
	for i := range st.Rules {
		changed = changed || st.Rules[i].Matched != prev.Rules[i].Matched
	}
	switch {
	case final:
		log.Info(what+": filter and routes, totals", e.statAttrs(st, zero)...)
	case changed:
		log.Info(what+": filter and routes in the last "+e.every.String(), e.statAttrs(st, prev)...)
	default:
		return
	}
	warn := func(flag string, now, before route.ExprStats) {
		if n := now.Errors - before.Errors; n > 0 {
			log.Warn(what+": an expression failed on records; they count as not matching (has(value.f) or value.?f.orValue(x) test a field first)",
				"flag", flag, "expr", now.Expr, "records", n, "last_error", now.LastError)
		}
	}
	warn("--filter", st.Filter, prev.Filter)
	for i := range st.Rules {
		warn(fmt.Sprintf("--route %d", i+1), st.Rules[i], prev.Rules[i])
	}
}

// statAttrs are the counts of st minus prev, as log attributes.
func (e *endpoints) statAttrs(st, prev route.Stats) []any {
	a := []any{"filtered", st.Filtered - prev.Filtered}
	if e.filter != "" {
		a = append(a, "filter_matched", st.Filter.Matched-prev.Filter.Matched)
	}
	for i := range st.Rules {
		a = append(a, "route_"+strconv.Itoa(i+1), st.Rules[i].Matched-prev.Rules[i].Matched)
	}
	if e.fallback != "" && len(e.specs) > 0 {
		a = append(a, "url", st.Fallback-prev.Fallback)
	}
	return append(a, "expression_errors", st.Errors()-prev.Errors())
}

// collectors are the Prometheus metrics of the filter and the routes, for
// serveStatus; none without them. The collector also adds their counts to
// /api/status and the status page (statusSection).
func (e *endpoints) collectors() []prometheus.Collector {
	if e.router == nil {
		return nil
	}
	return []prometheus.Collector{routeCollector{e}}
}

var (
	routeFilteredDesc = prometheus.NewDesc("kpar_route_filtered_total",
		"Records that --filter or --route sent nowhere: they finished without a request.", nil, nil)
	routeFallbackDesc = prometheus.NewDesc("kpar_route_unmatched_total",
		"Records no --route matched, sent to --url (counted once their request finished).", nil, nil)
	routeMatchedDesc = prometheus.NewDesc("kpar_route_matched_total",
		"Records --filter let through (rule \"filter\") or a --route sent to its URL (rule \"1\", \"2\", ...), counted once their request finished (2xx, or refused for good).", []string{"rule", "url"}, nil)
	routeErrorsDesc = prometheus.NewDesc("kpar_route_expression_errors_total",
		"Records --filter or a --route failed on (a missing field, a value that is not JSON), each counted as not matching.", []string{"rule"}, nil)
)

// routeCollector reads the route.Handler's counts at each scrape.
type routeCollector struct{ e *endpoints }

func (c routeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- routeFilteredDesc
	ch <- routeFallbackDesc
	ch <- routeMatchedDesc
	ch <- routeErrorsDesc
}

func (c routeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.router.Stats()
	ch <- prometheus.MustNewConstMetric(routeFilteredDesc, prometheus.CounterValue, float64(st.Filtered))
	ch <- prometheus.MustNewConstMetric(routeFallbackDesc, prometheus.CounterValue, float64(st.Fallback))
	if c.e.filter != "" {
		ch <- prometheus.MustNewConstMetric(routeMatchedDesc, prometheus.CounterValue, float64(st.Filter.Matched), "filter", "")
		ch <- prometheus.MustNewConstMetric(routeErrorsDesc, prometheus.CounterValue, float64(st.Filter.Errors), "filter")
	}
	for i, r := range st.Rules {
		n := strconv.Itoa(i + 1)
		ch <- prometheus.MustNewConstMetric(routeMatchedDesc, prometheus.CounterValue, float64(r.Matched), n, redactURL(c.e.specs[i].url))
		ch <- prometheus.MustNewConstMetric(routeErrorsDesc, prometheus.CounterValue, float64(r.Errors), n)
	}
}

// routeStatus is the filter and the routes in /api/status.
type routeStatus struct {
	Filtered uint64 `json:"filtered"`
	// Unmatched is the records no route matched, sent to URL (--url).
	Unmatched uint64            `json:"unmatched"`
	URL       string            `json:"url"` // "" without --url: unmatched records are filtered
	Errors    uint64            `json:"expression_errors"`
	Rules     []routeRuleStatus `json:"rules"` // the filter first, then each route
}

type routeRuleStatus struct {
	Rule      string `json:"rule"` // "filter", or the route's number from 1
	Expr      string `json:"expr"`
	URL       string `json:"url,omitempty"`
	Matched   uint64 `json:"matched"`
	Errors    uint64 `json:"errors"`
	LastError string `json:"last_error,omitempty"`
}

func (c routeCollector) addStatus(s *statusResponse) {
	st := c.e.router.Stats()
	rs := &routeStatus{Filtered: st.Filtered, Unmatched: st.Fallback, URL: redactURL(c.e.fallback), Errors: st.Errors(), Rules: []routeRuleStatus{}}
	if c.e.filter != "" {
		rs.Rules = append(rs.Rules, routeRuleStatus{Rule: "filter", Expr: st.Filter.Expr, Matched: st.Filter.Matched, Errors: st.Filter.Errors, LastError: st.Filter.LastError})
	}
	for i, r := range st.Rules {
		rs.Rules = append(rs.Rules, routeRuleStatus{Rule: strconv.Itoa(i + 1), Expr: r.Expr, URL: redactURL(c.e.specs[i].url), Matched: r.Matched, Errors: r.Errors, LastError: r.LastError})
	}
	s.Routes = rs
}
