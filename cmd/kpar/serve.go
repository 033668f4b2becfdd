package main

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/kparprom"
)

// defaultStatusAddr is where the status server listens when no address is
// given: loopback only, on the port commonly used for Prometheus exporters
// of client libraries.
const defaultStatusAddr = "127.0.0.1:9464"

// statusRefresh is how often the live page polls /api/status.
const statusRefresh = time.Second

// serveStatus serves the consumer's metrics and status over HTTP on addr
// (defaultStatusAddr when empty) until ctx ends, and returns the address it
// listens on (useful with port 0). It returns once the listener is bound;
// the server runs in the background and stops shortly after ctx ends.
//
//	GET /metrics     Prometheus metrics: m's registry (hook counters, the
//	                 client's kprom metrics), per-partition gauges of c, the
//	                 Go and process collectors, and extra
//	GET /            a live page of the partition windows, lag and recent
//	                 dead letters, polling /api/status
//	GET /api/status  the page's data as JSON
//	GET /healthz     200 while the process serves
//	GET /readyz      200 while c is a member of its group, with partitions
//	                 or idle (a share-group member: while it runs; see
//	                 kparprom.Metrics.Ready), and, with ready, makes
//	                 progress: records waiting and none finished for the
//	                 stall grace is 503 too (readiness.go); the body says
//	                 why
//
// ready, when not nil, must observe c (its opts passed to kpar.New); its
// sampler runs until ctx ends. An address with an empty host (":9464") is
// rejected, since it would listen on every interface: a non-loopback
// address must be named.
func serveStatus(ctx context.Context, addr string, c *kpar.Consumer, m *kparprom.Metrics, ready *stallWatch, extra ...prometheus.Collector) (boundAddr string, err error) {
	if c == nil || m == nil {
		return "", errors.New("status server: nil Consumer or Metrics")
	}
	addr, err = statusListenAddr(addr)
	if err != nil {
		return "", err
	}
	reg := prometheus.NewRegistry()
	cs := append([]prometheus.Collector{
		m.PartitionCollector(c.Partitions),
		m.OverdueCollector(c.Overdue),
		m.LimitCollector(c.ConcurrencyLimit),
		m.ShareCollector(c.ShareStats),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}, extra...)
	for _, col := range cs {
		if err := reg.Register(col); err != nil {
			return "", fmt.Errorf("status server: registering metrics: %w", err)
		}
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("status server: %w", err)
	}
	var sections []statusSection
	for _, col := range extra {
		if s, ok := col.(statusSection); ok {
			sections = append(sections, s)
		}
	}
	readiness := m.Ready
	if ready != nil {
		go ready.run(ctx, ready.consumerWork(c))
		readiness = func() (bool, string) { return ready.ready(m.Ready) }
	}
	srv := &http.Server{
		Handler:           statusHandler(c, m, readiness, prometheus.Gatherers{m.Registry(), reg}, sections...),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       time.Minute,
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln) // returns ErrServerClosed after Shutdown
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close() // a scrape or page request outlived the grace period
		}
		<-served
	}()
	return ln.Addr().String(), nil
}

// statusListenAddr defaults addr and rejects an empty host.
func statusListenAddr(addr string) (string, error) {
	if addr == "" {
		return defaultStatusAddr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("status server: listen address %q: want host:port, such as %s", addr, defaultStatusAddr)
	}
	if host == "" {
		return "", fmt.Errorf("status server: listen address %q has no host and would listen on every interface: use 127.0.0.1:%s for this machine only, or name the interface (0.0.0.0:%[2]s for all)", addr, port)
	}
	return addr, nil
}

// statusSection is an extra collector of serveStatus that also adds a
// part of its own to /api/status (route.go's filter and routes).
type statusSection interface{ addStatus(*statusResponse) }

// statusHandler serves the endpoints of serveStatus; readiness answers
// /readyz.
func statusHandler(c *kpar.Consumer, m *kparprom.Metrics, readiness func() (bool, string), g prometheus.Gatherer, sections ...statusSection) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		Timeout:       10 * time.Second,
		ErrorHandling: promhttp.ContinueOnError, // serve what gathered rather than nothing
	}))
	mux.HandleFunc("GET /{$}", servePage)
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		resp := status(r.Context(), c, m, readiness)
		for _, s := range sections {
			s.addStatus(&resp)
		}
		json.NewEncoder(w).Encode(resp)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := readiness()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %s\n", why)
			return
		}
		fmt.Fprintf(w, "ready: %s\n", why)
	})
	return mux
}

// statusResponse is the JSON of /api/status.
type statusResponse struct {
	Time      time.Time       `json:"time"`
	Ready     bool            `json:"ready"`
	Readiness string          `json:"readiness"`
	Totals    kparprom.Totals `json:"totals"`
	// ConcurrencyLimit is how many records may be in flight now: the
	// adaptive limit with --adaptive, else --concurrency.
	ConcurrencyLimit int `json:"concurrency_limit"`
	// RateLimit is --rate-limit and --key-rate-limit (per_second 0: off).
	RateLimit rateStatus `json:"rate_limit"`
	// Backlog is the records not finished over the assigned partitions
	// whose high watermark is known: the sum of their backlogs.
	Backlog    int64             `json:"backlog"`
	Partitions []partitionStatus `json:"partitions"`
	// Share is set for a share-group member (no partitions then).
	Share       *shareStatus               `json:"share,omitempty"`
	DeadLetters []kparprom.DeadLetterEntry `json:"dead_letters"` // newest first
	// Routes is set with --filter or --route (route.go).
	Routes *routeStatus `json:"routes,omitempty"`
}

// rateStatus is the rate limits of statusResponse.
type rateStatus struct {
	PerSecond    float64 `json:"per_second"`
	Burst        int     `json:"burst"`
	KeyPerSecond float64 `json:"key_per_second"`
	KeyBurst     int     `json:"key_burst"`
	Keys         int     `json:"keys"` // keys with a bucket now
}

// shareStatus is kpar.ShareStats in /api/status.
type shareStatus struct {
	Group            string `json:"group"`
	Acquired         int    `json:"acquired"`  // held: polled, not acknowledged
	InFlight         int    `json:"in_flight"` // in a handler now
	Retrying         int    `json:"retrying"`  // held, waiting for a retry
	Received         int64  `json:"received"`
	Redelivered      int64  `json:"redelivered"` // received with a delivery count above 1
	MaxDeliveryCount int32  `json:"max_delivery_count"`
	DeliveryLimit    int32  `json:"delivery_limit"`
	Accepted         int64  `json:"accepted"`      // dead letters included
	DeadLettered     int64  `json:"dead_lettered"` // accepted once the sink acknowledged them
	Released         int64  `json:"released"`
	Renewed          int64  `json:"renewed"`
	AckErrors        int64  `json:"ack_errors"`
}

// partitionStatus is one partition of statusResponse. Offsets not known
// yet are -1.
type partitionStatus struct {
	Topic         string `json:"topic"`
	Partition     int32  `json:"partition"`
	Start         int64  `json:"start"`          // lowest unfinished offset
	End           int64  `json:"end"`            // offset after the newest fetched record
	Committed     int64  `json:"committed"`      // last committed by kpar in this assignment
	HighWatermark int64  `json:"high_watermark"` // as last listed from the brokers
	Lag           int64  `json:"lag"`            // high watermark - committed
	Backlog       int64  `json:"backlog"`        // records not finished: high watermark - start - finished
	Buffered      int    `json:"buffered"`       // records from start through end
	Finished      int    `json:"finished"`       // records above start already done
	InFlight      int    `json:"in_flight"`      // records in a handler now
	Paused        bool   `json:"paused"`         // fetching paused: window full
	// StuckOffset is the record kpar reported stuck, holding the window
	// start (and commits) for StuckSeconds; -1 when none.
	StuckOffset  int64   `json:"stuck_offset"`
	StuckSeconds float64 `json:"stuck_seconds"`
}

func status(ctx context.Context, c *kpar.Consumer, m *kparprom.Metrics, readiness func() (bool, string)) statusResponse {
	ok, why := readiness()
	resp := statusResponse{
		Time:             time.Now().UTC(),
		Ready:            ok,
		Readiness:        why,
		Totals:           m.Totals(),
		ConcurrencyLimit: c.ConcurrencyLimit(),
		RateLimit:        rateStatus(c.RateLimits()),
		Partitions:       []partitionStatus{},
		DeadLetters:      m.RecentDeadLetters(),
	}
	if st, share := c.ShareStats(); share {
		resp.Share = &shareStatus{
			Group: st.Group, Acquired: st.Acquired, InFlight: st.InFlight, Retrying: st.Retrying,
			Received: st.Received, Redelivered: st.Redelivered,
			MaxDeliveryCount: st.MaxDeliveryCount, DeliveryLimit: st.DeliveryLimit,
			Accepted: st.Accepted, DeadLettered: st.DeadLettered, Released: st.Released,
			Renewed: st.Renewed, AckErrors: st.AckErrors,
		}
	}
	for _, s := range m.PartitionStatus(ctx, c.Partitions()) {
		if s.Backlog > 0 {
			resp.Backlog += s.Backlog
		}
		resp.Partitions = append(resp.Partitions, partitionStatus{
			Topic: s.Topic, Partition: s.Partition,
			Start: s.Start, End: s.End, Committed: s.Committed,
			HighWatermark: s.HighWatermark, Lag: s.Lag, Backlog: s.Backlog,
			Buffered: s.Buffered, Finished: s.Finished, InFlight: s.InFlight,
			Paused:      s.Paused,
			StuckOffset: s.StuckOffset, StuckSeconds: s.StuckFor.Seconds(),
		})
	}
	return resp
}

func servePage(w http.ResponseWriter, _ *http.Request) {
	var b [16]byte
	rand.Read(b[:])
	nonce := base64.StdEncoding.EncodeToString(b[:])
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; connect-src 'self'; img-src data:; "+
		"script-src 'nonce-"+nonce+"'; style-src 'nonce-"+nonce+"'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	statusPage.Execute(w, struct {
		Nonce         string
		RefreshMillis int64
	}{nonce, statusRefresh.Milliseconds()})
}

// statusHTML (status.html) is the live page: everything inline, nothing fetched but
// /api/status. It renders with textContent only, so record data (topics,
// error texts) is never parsed as HTML.
//
//go:embed status.html
var statusHTML string

var statusPage = template.Must(template.New("status").Parse(statusHTML))
