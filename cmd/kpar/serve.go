package main

import (
	"context"
	"crypto/rand"
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
//	                 or idle; 503 otherwise (see kparprom.Metrics.Ready)
//
// An address with an empty host (":9464") is rejected, since it would
// listen on every interface: a non-loopback address must be named.
func serveStatus(ctx context.Context, addr string, c *kpar.Consumer, m *kparprom.Metrics, extra ...prometheus.Collector) (boundAddr string, err error) {
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
	srv := &http.Server{
		Handler:           statusHandler(c, m, prometheus.Gatherers{m.Registry(), reg}),
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

func statusHandler(c *kpar.Consumer, m *kparprom.Metrics, g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		Timeout:       10 * time.Second,
		ErrorHandling: promhttp.ContinueOnError, // serve what gathered rather than nothing
	}))
	mux.HandleFunc("GET /{$}", servePage)
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(status(r.Context(), c, m))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := m.Ready()
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
	Time        time.Time                  `json:"time"`
	Ready       bool                       `json:"ready"`
	Readiness   string                     `json:"readiness"`
	Totals      kparprom.Totals            `json:"totals"`
	Partitions  []partitionStatus          `json:"partitions"`
	DeadLetters []kparprom.DeadLetterEntry `json:"dead_letters"` // newest first
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
	Buffered      int    `json:"buffered"`       // records from start through end
	Finished      int    `json:"finished"`       // records above start already done
	InFlight      int    `json:"in_flight"`      // records in a handler now
	Paused        bool   `json:"paused"`         // fetching paused: window full
	// StuckOffset is the record kpar reported stuck, holding the window
	// start (and commits) for StuckSeconds; -1 when none.
	StuckOffset  int64   `json:"stuck_offset"`
	StuckSeconds float64 `json:"stuck_seconds"`
}

func status(ctx context.Context, c *kpar.Consumer, m *kparprom.Metrics) statusResponse {
	ok, why := m.Ready()
	resp := statusResponse{
		Time:        time.Now().UTC(),
		Ready:       ok,
		Readiness:   why,
		Totals:      m.Totals(),
		Partitions:  []partitionStatus{},
		DeadLetters: m.RecentDeadLetters(),
	}
	for _, s := range m.PartitionStatus(ctx, c.Partitions()) {
		resp.Partitions = append(resp.Partitions, partitionStatus{
			Topic: s.Topic, Partition: s.Partition,
			Start: s.Start, End: s.End, Committed: s.Committed,
			HighWatermark: s.HighWatermark, Lag: s.Lag,
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

// statusPage is the live page: everything inline, nothing fetched but
// /api/status. It renders with textContent only, so record data (topics,
// error texts) is never parsed as HTML.
var statusPage = template.Must(template.New("status").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>kpar status</title>
<style nonce="{{.Nonce}}">
:root { --fg: #1d232a; --muted: #66707a; --line: #d8dde2; --bg: #fff; --head: #f3f5f7;
        --done: #2e9e5b; --run: #2f6fd6; --wait: #c3cad1; --warn: #c25d00; --bad: #b3261e; }
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); margin: 1.5rem; }
h1 { font-size: 1.3rem; margin: 0 0 .25rem; }
h2 { font-size: 1.05rem; margin: 1.5rem 0 .5rem; }
.muted { color: var(--muted); }
.badge { display: inline-block; padding: 0 .5em; border-radius: .8em; font-size: .85em; color: #fff; background: var(--muted); }
.badge.ok { background: var(--done); } .badge.bad { background: var(--bad); } .badge.warn { background: var(--warn); }
#totals span { margin-right: 1.2em; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: right; padding: .3em .6em; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { background: var(--head); font-weight: 600; }
th:first-child, td:first-child, td.text, th.text { text-align: left; }
td.window { width: 35%; min-width: 12em; }
.bar { display: flex; height: .9em; background: var(--head); border: 1px solid var(--line); border-radius: 3px; overflow: hidden; }
.bar span { display: block; height: 100%; }
.seg-done { background: var(--done); } .seg-run { background: var(--run); } .seg-wait { background: var(--wait); }
.legend span { margin-right: 1em; } .legend i { display: inline-block; width: .8em; height: .8em; margin-right: .3em; vertical-align: -1px; }
td.error { white-space: normal; text-align: left; max-width: 40em; overflow-wrap: anywhere; font-family: ui-monospace, monospace; font-size: .9em; }
</style>
</head>
<body data-loaded="false">
<h1>kpar consumer</h1>
<div><span id="ready" class="badge">loading</span> <span id="readiness" class="muted"></span> <span id="conn" class="muted"></span></div>
<p id="totals" class="muted"></p>
<noscript><p>This page needs JavaScript; the same data is at <a href="api/status">api/status</a> and <a href="metrics">metrics</a>.</p></noscript>

<h2>Partitions</h2>
<p class="legend muted">Window from start (lowest unfinished offset, what a commit stores) to end (next offset to fetch):
<span><i class="seg-done"></i>finished above start</span><span><i class="seg-run"></i>in flight</span><span><i class="seg-wait"></i>waiting</span></p>
<table>
<thead><tr><th>Partition</th><th class="text">Window</th><th>Records</th><th>Start</th><th>In flight</th><th>Finished</th><th>End</th>
<th>Committed</th><th>High watermark</th><th>Lag</th><th class="text">State</th></tr></thead>
<tbody id="partitions"><tr><td colspan="11" class="muted text">Loading…</td></tr></tbody>
</table>

<h2>Recent dead letters</h2>
<table>
<thead><tr><th class="text">Time</th><th class="text">Record</th><th class="text">Class</th><th>Attempts</th><th class="text">Error</th></tr></thead>
<tbody id="deadletters"><tr><td colspan="5" class="muted text">Loading…</td></tr></tbody>
</table>

<script nonce="{{.Nonce}}">
"use strict";
const refreshMillis = {{.RefreshMillis}};

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
const off = (n) => (n < 0 ? "–" : n.toLocaleString("en-US"));
function duration(sec) {
  if (sec < 60) return sec.toFixed(1) + "s";
  const m = Math.floor(sec / 60);
  return m < 60 ? m + "m" + Math.floor(sec % 60) + "s" : Math.floor(m / 60) + "h" + (m % 60) + "m";
}

function emptyRow(cols, text) {
  const tr = el("tr"), td = el("td", text, "muted text");
  td.colSpan = cols;
  tr.append(td);
  return tr;
}

function windowBar(p, scale) {
  const bar = el("div", null, "bar");
  const waiting = Math.max(p.buffered - p.finished - p.in_flight, 0);
  for (const [n, cls] of [[p.finished, "seg-done"], [p.in_flight, "seg-run"], [waiting, "seg-wait"]]) {
    if (n <= 0) continue;
    const s = el("span", null, cls);
    s.style.width = (100 * n / scale) + "%";
    bar.append(s);
  }
  bar.title = p.buffered + " records in the window: " + p.finished + " finished, " + p.in_flight + " in flight, " + waiting + " waiting";
  return bar;
}

function renderPartitions(parts) {
  const body = document.getElementById("partitions");
  if (parts.length === 0) {
    body.replaceChildren(emptyRow(11, "No partitions assigned."));
    return;
  }
  const scale = Math.max(1, ...parts.map((p) => p.buffered));
  body.replaceChildren(...parts.map((p) => {
    const tr = el("tr");
    tr.dataset.topic = p.topic;
    tr.dataset.partition = String(p.partition);
    const win = el("td", null, "window text");
    win.append(windowBar(p, scale));
    tr.append(el("td", p.topic + "/" + p.partition), win, el("td", off(p.buffered)), el("td", off(p.start)), el("td", off(p.in_flight)),
      el("td", off(p.finished)), el("td", off(p.end)), el("td", off(p.committed)),
      el("td", off(p.high_watermark)), el("td", off(p.lag)));
    const state = el("td", null, "text");
    if (p.stuck_offset >= 0) {
      state.append(el("span", "stuck at " + off(p.stuck_offset) + " for " + duration(p.stuck_seconds), "badge bad"), " ");
    }
    state.append(p.paused ? el("span", "paused: window full", "badge warn") : el("span", "fetching", "muted"));
    tr.append(state);
    return tr;
  }));
}

function renderDeadLetters(dls) {
  const body = document.getElementById("deadletters");
  if (dls.length === 0) {
    body.replaceChildren(emptyRow(5, "No dead letters."));
    return;
  }
  body.replaceChildren(...dls.map((d) => {
    const tr = el("tr");
    tr.dataset.deadLetter = d.topic + "/" + d.partition + "/" + d.offset;
    tr.append(el("td", new Date(d.time).toLocaleTimeString(), "text"),
      el("td", d.topic + "/" + d.partition + " @ " + d.offset, "text"),
      el("td", d.class, "text"), el("td", d.attempts), el("td", d.error, "error"));
    return tr;
  }));
}

function render(s) {
  const ready = document.getElementById("ready");
  ready.textContent = s.ready ? "ready" : "not ready";
  ready.className = "badge " + (s.ready ? "ok" : "bad");
  document.getElementById("readiness").textContent = s.readiness;
  const t = s.totals;
  const totals = document.getElementById("totals");
  totals.replaceChildren(el("span", "handled " + off(t.handled)), el("span", "failed attempts " + off(t.failed)),
    el("span", "retried " + off(t.retried)), el("span", "dead-lettered " + off(t.dead_lettered)),
    el("span", "dead-letter write errors " + off(t.dead_letter_errors)), el("span", "stuck records " + off(t.stuck)));
  renderPartitions(s.partitions || []);
  renderDeadLetters(s.dead_letters || []);
  document.body.dataset.loaded = "true";
}

async function refresh() {
  const conn = document.getElementById("conn");
  try {
    const res = await fetch("api/status", { cache: "no-store" });
    if (!res.ok) throw new Error("HTTP " + res.status);
    render(await res.json());
    conn.textContent = "· updated " + new Date().toLocaleTimeString();
  } catch (e) {
    conn.textContent = "· cannot reach the consumer (" + e.message + "); retrying";
  } finally {
    setTimeout(refresh, refreshMillis);
  }
}
refresh();
</script>
</body>
</html>
`))
