package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/route"
)

// Records of the route tests: record i has the JSON value
// {"i":i,"kind":K}, where K is "a", "b" or "c" by i mod 3, except that
// every tenth record (i mod 10 == 9) has no kind at all, so that an
// expression reading value.kind fails on it.
func routeKind(i int) string {
	if i%10 == 9 {
		return ""
	}
	return [...]string{"a", "b", "c"}[i%3]
}

// produceKinds writes n such records, keyed k<i mod 7>, with a
// content-type: application/json header when jsonHeader.
func produceKinds(ctx context.Context, t *testing.T, addr, topic string, n int, jsonHeader bool) {
	t.Helper()
	cl := newClient(t, addr, kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic(topic))
	defer cl.Close()
	rs := make([]*kgo.Record, n)
	for i := range n {
		v := fmt.Sprintf(`{"i":%d,"kind":%q}`, i, routeKind(i))
		if routeKind(i) == "" {
			v = fmt.Sprintf(`{"i":%d}`, i)
		}
		rs[i] = &kgo.Record{Key: fmt.Appendf(nil, "k%d", i%7), Value: []byte(v)}
		if jsonHeader {
			rs[i].Headers = []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/json")}}
		}
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// kindsOf returns the indexes below n of the given kinds.
func kindsOf(n int, kinds ...string) map[int]bool {
	out := map[int]bool{}
	for i := range n {
		for _, k := range kinds {
			if routeKind(i) == k {
				out[i] = true
			}
		}
	}
	return out
}

// routeEndpoint records which records (by their "i") reach each path, one
// record per request or in --batch arrays, and answers each record with
// 200 and the reply {"reply":i}.
type routeEndpoint struct {
	srv *httptest.Server
	changes
	got      map[string]map[int]int // path -> i -> requests (guarded by mu)
	maxBatch int
	bad      []string
}

func newRouteEndpoint(t *testing.T) *routeEndpoint {
	e := &routeEndpoint{got: map[string]map[int]int{}}
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *routeEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var values [][]byte
	if bytes.HasPrefix(body, []byte("[")) {
		var items []struct {
			Value string `json:"value"`
		}
		if err := json.Unmarshal(body, &items); err != nil {
			e.note(func() { e.bad = append(e.bad, "batch: "+err.Error()) })
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		for _, it := range items {
			v, _ := base64.StdEncoding.DecodeString(it.Value)
			values = append(values, v)
		}
	} else {
		values = [][]byte{body}
	}
	var is []int
	for _, v := range values {
		var rec struct{ I *int }
		if err := json.Unmarshal(v, &rec); err != nil || rec.I == nil {
			e.note(func() { e.bad = append(e.bad, fmt.Sprintf("%s: value %q", r.URL.Path, v)) })
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		is = append(is, *rec.I)
	}
	e.note(func() {
		if e.got[r.URL.Path] == nil {
			e.got[r.URL.Path] = map[int]int{}
		}
		for _, i := range is {
			e.got[r.URL.Path][i]++
		}
		e.maxBatch = max(e.maxBatch, len(is))
	})
	w.Header().Set("Content-Type", "application/json")
	if !bytes.HasPrefix(body, []byte("[")) {
		fmt.Fprintf(w, `{"reply":%d}`, is[0])
		return
	}
	answers := make([]string, len(is))
	for k, i := range is {
		answers[k] = fmt.Sprintf(`{"status":200,"reply":{"reply":%d}}`, i)
	}
	fmt.Fprintf(w, "[%s]", strings.Join(answers, ","))
}

// checkReplies reads the n replies of topic: one for each of want.
func checkReplies(ctx context.Context, t *testing.T, addr, topic string, want map[int]bool) {
	t.Helper()
	replied := map[int]bool{}
	for _, r := range readAll(ctx, t, addr, topic, len(want)) {
		var v struct{ Reply int }
		if err := json.Unmarshal(r.Value, &v); err != nil || !want[v.Reply] {
			t.Fatalf("reply %q is not one of a sent record", r.Value)
		}
		replied[v.Reply] = true
	}
	if len(replied) != len(want) {
		t.Errorf("%d records replied to, want %d", len(replied), len(want))
	}
}

// waitPaths waits until each path has received exactly its records (and
// fails the test at once when a record reaches a path not its own).
func (e *routeEndpoint) waitPaths(ctx context.Context, t *testing.T, p *process, want map[string]map[int]bool) {
	t.Helper()
	wrong := ""
	done := e.await(ctx, p.exited, func() bool {
		all := true
		for path, got := range e.got {
			for i := range got {
				if !want[path][i] {
					wrong = fmt.Sprintf("record %d (kind %q) reached %s", i, routeKind(i), path)
					return true
				}
			}
		}
		for path, is := range want {
			all = all && len(e.got[path]) == len(is)
		}
		return all
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case wrong != "":
		t.Fatalf("%s; stderr:\n%s", wrong, tail(p.stderr))
	case len(e.bad) > 0:
		t.Fatalf("malformed requests: %v", e.bad)
	case !done:
		counts := map[string]int{}
		for path, got := range e.got {
			counts[path] = len(got)
		}
		t.Fatalf("waiting for the routed records (got %v): %v, or kpar exited (%v); stderr:\n%s", counts, ctx.Err(), p.waitErr, tail(p.stderr))
	}
}

// statusAddr is the --metrics-listen address from the startup line.
func statusAddr(t *testing.T, p *process) string {
	t.Helper()
	_, after, _ := strings.Cut(p.stderr.String(), "metrics_listen=")
	addr, _, _ := strings.Cut(after, " ")
	addr, _, _ = strings.Cut(addr, "\n")
	if addr == "" {
		t.Fatalf("no metrics_listen address in the startup line; stderr:\n%s", tail(p.stderr))
	}
	return addr
}

// awaitStatus polls /api/status until cond holds: the counts it reads
// have no event to wait on.
func awaitStatus(ctx context.Context, t *testing.T, addr, what string, cond func(statusResponse) bool) statusResponse {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var s statusResponse
	for {
		s = statusResponse{}
		if err := json.Unmarshal([]byte(httpGet(ctx, t, "http://"+addr+"/api/status")), &s); err != nil {
			t.Fatal(err)
		}
		if cond(s) {
			return s
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			b, _ := json.Marshal(s)
			t.Fatalf("waiting for %s: %v; last status: %s", what, ctx.Err(), b)
		}
	}
}

// TestForwardRoutesBatchesPerURLAndCommitsFilteredRecords runs `kpar
// forward --group` with two --route rules, no --url, --batch and
// --reply-topic: each URL gets exactly its kind, in batches of that kind
// only, and each of those records gets its reply; the records of neither
// kind (and those without a kind, whose expressions fail) are filtered,
// counted in the log, and committed: the group's offsets reach the end of
// every partition.
func TestForwardRoutesBatchesPerURLAndCommitsFilteredRecords(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "3")
	const n = 600
	produceKinds(ctx, t, addr, "events", n, true)
	ep := newRouteEndpoint(t)
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "routed", "--topic", "events",
		"--route", `value.kind == "a" -> `+ep.srv.URL+"/a",
		"--route", `value.kind == "b" -> `+ep.srv.URL+"/b",
		"--batch", "20", "--batch-wait", "100ms", "--reply-topic", "replies")
	as, bs := kindsOf(n, "a"), kindsOf(n, "b")
	ep.waitPaths(ctx, t, p, map[string]map[int]bool{"/a": as, "/b": bs})
	filtered, noKind := len(kindsOf(n, "c", "")), len(kindsOf(n, ""))
	ep.mu.Lock()
	maxBatch := ep.maxBatch
	ep.mu.Unlock()
	if maxBatch < 2 {
		t.Errorf("the largest request held %d records; want batches", maxBatch)
	}

	cl := newClient(t, addr)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for committed := false; !committed; {
		offsets, err := readOffsets(ctx, adm, "routed", "events")
		committed = err == nil && len(offsets) == 3
		for _, o := range offsets {
			committed = committed && o.committed == o.end
		}
		if committed {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the group's commits did not reach the end of the topic: %v (%v); stderr:\n%s", offsets, err, tail(p.stderr))
		}
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	if want := fmt.Sprintf(`filter and routes, totals" filtered=%d route_1=%d route_2=%d expression_errors=%d`, filtered, len(as), len(bs), 2*noKind); !strings.Contains(p.stderr.String(), want) {
		t.Errorf("the log lacks %q; stderr:\n%s", want, tail(p.stderr))
	}
	checkReplies(ctx, t, addr, "replies", kindsOf(n, "a", "b"))
}

// TestForwardFilterInAShareGroupAcknowledgesFilteredRecords runs `kpar
// forward --share-group --filter ...`: only the matching records reach
// --url; every record, the filtered too, is acknowledged (accepted); the
// counts are on /api/status and /metrics.
func TestForwardFilterInAShareGroupAcknowledgesFilteredRecords(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "2")
	const n = 300
	produceKinds(ctx, t, addr, "events", n, false)
	ep := newRouteEndpoint(t)
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--share-group", "shared", "--topic", "events",
		"--filter", `value.kind != "c"`, "--url", ep.srv.URL+"/in", "--content-type", "application/json",
		"--metrics-listen", "127.0.0.1:0")
	sent := kindsOf(n, "a", "b")
	ep.waitPaths(ctx, t, p, map[string]map[int]bool{"/in": sent})
	filtered, noKind := len(kindsOf(n, "c", "")), len(kindsOf(n, ""))
	status := statusAddr(t, p)
	st := awaitStatus(ctx, t, status, "every record acknowledged", func(s statusResponse) bool {
		return s.Share != nil && s.Share.Accepted == n
	})
	if r := st.Routes; r == nil || r.Filtered != uint64(filtered) || len(r.Rules) != 1 || r.Rules[0].Rule != "filter" ||
		r.Rules[0].Matched != uint64(len(sent)) || r.Errors != uint64(noKind) || !strings.Contains(r.Rules[0].LastError, "no such key") {
		t.Errorf("routes on /api/status: %+v; want %d filtered, %d matched, %d errors", r, filtered, len(sent), noKind)
	}
	metrics := httpGet(ctx, t, "http://"+status+"/metrics")
	for _, want := range []string{
		fmt.Sprintf("kpar_route_filtered_total %d", filtered),
		fmt.Sprintf(`kpar_route_matched_total{rule="filter",url=""} %d`, len(sent)),
		fmt.Sprintf(`kpar_route_expression_errors_total{rule="filter"} %d`, noKind),
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The live page draws the filter's row (when a browser is there).
	if _, err := os.Stat(chromiumPath); err == nil {
		dom := chromium(t, "--dump-dom", "http://"+status+"/")
		for _, want := range []string{`<tr data-rule="filter"><td class="text">--filter</td><td class="text">value.kind != "c"</td>`,
			fmt.Sprintf("filtered %d (finished without a request)", filtered), "no such key"} {
			if !strings.Contains(dom, want) {
				t.Errorf("the status page lacks %q; DOM:\n%s", want, dom)
			}
		}
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	if want := fmt.Sprintf(`filter and routes, totals" filtered=%d filter_matched=%d`, filtered, len(sent)); !strings.Contains(p.stderr.String(), want) {
		t.Errorf("the log lacks %q; stderr:\n%s", want, tail(p.stderr))
	}
}

// TestBackfillFilterAndRoutes runs `kpar backfill` with --filter, a
// --route and --url: the route's kind reaches its URL, the other matching
// kind --url, and the filtered records finish without a request; the run
// ends with every record handled.
func TestBackfillFilterAndRoutes(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "1")
	const n = 300
	produceKinds(ctx, t, addr, "events", n, true)
	ep := newRouteEndpoint(t)
	var stdout bytes.Buffer
	p := startBackfill(ctx, t, bin, &stdout, "--brokers", addr, "--topic", "events", "--from", "0", "--to", fmt.Sprint(n),
		"--filter", `has(value.kind) && value.kind != "c"`,
		"--route", `value.kind == "a" -> `+ep.srv.URL+"/a", "--url", ep.srv.URL+"/rest", "--readers", "2")
	if code := p.wait(ctx, t); code != 0 {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	ep.waitPaths(ctx, t, p, map[string]map[int]bool{"/a": kindsOf(n, "a"), "/rest": kindsOf(n, "b")})
	if want := fmt.Sprintf("kpar backfill: done: %d records: %d handled (0 after a failed attempt), 0 dead-lettered", n, n); !strings.HasPrefix(stdout.String(), want) {
		t.Errorf("stdout %q, want it to start with %q", stdout.String(), want)
	}
	filtered := len(kindsOf(n, "c", ""))
	if want := fmt.Sprintf(`filter and routes, totals" filtered=%d filter_matched=%d route_1=%d url=%d expression_errors=0`,
		filtered, n-filtered, len(kindsOf(n, "a")), len(kindsOf(n, "b"))); !strings.Contains(p.stderr.String(), want) {
		t.Errorf("the log lacks %q; stderr:\n%s", want, tail(p.stderr))
	}
}

// TestFilterAndRouteFlagErrorsExit2 checks that an expression that does
// not compile, a --route without its arrow and a command with neither
// --url nor --route are usage errors naming the flag (and the position).
func TestFilterAndRouteFlagErrorsExit2(t *testing.T) {
	fwd := []string{"--brokers", "127.0.0.1:1", "--group", "g", "--topic", "t"}
	bf := []string{"--brokers", "127.0.0.1:1", "--topic", "t", "--from", "0", "--to", "10"}
	for _, tc := range []struct {
		name string
		cmd  func(context.Context, []string, io.Writer, io.Writer) int
		args []string
		want []string
	}{
		{"filter with an unknown variable", cmdForward, append(fwd, "--url", "http://127.0.0.1:1/", "--filter", `value.amount > 100 && topc == "x"`),
			[]string{"invalid --filter: 1:23: undeclared reference to 'topc'", " | value.amount > 100 && topc == \"x\"\n | ......................^"}},
		{"route with a syntax error", cmdForward, append(fwd, "--route", `true -> http://127.0.0.1:1/a`, "--route", `value.x == -> http://127.0.0.1:1/b`),
			[]string{"invalid --route 2: 1:11: Syntax error"}},
		{"route with a type error", cmdBackfill, append(bf, "--route", `partition == "3" -> http://127.0.0.1:1/a`),
			[]string{"invalid --route 1: 1:11: found no matching overload for '_==_' applied to '(int, string)'"}},
		{"route that is not a bool", cmdBackfill, append(bf, "--route", `topic -> http://127.0.0.1:1/a`),
			[]string{"invalid --route 1: 1:1: the expression is of type string; want a bool"}},
		{"route without an arrow", cmdForward, append(fwd, "--route", `true http://127.0.0.1:1/a`),
			[]string{"invalid --route 1", "want 'EXPR -> URL'"}},
		{"route with a bad URL", cmdForward, append(fwd, "--route", `true -> ftp://127.0.0.1:1/a`),
			[]string{"invalid --route 1 URL", "scheme must be http or https"}},
		{"no url and no route", cmdForward, append(fwd, "--filter", "true"),
			[]string{"missing --url (or KPAR_URL), or --route"}},
		{"backfill without url or route", cmdBackfill, bf,
			[]string{"missing --url (or KPAR_URL), or --route"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := tc.cmd(t.Context(), tc.args, &stdout, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// TestRouteSummaryLogsChangesEachIntervalAndTheTotals checks the log
// summary in virtual time: a line for each interval in which something
// happened, none for a quiet one, a warning naming an expression that
// failed, and the totals at the end.
func TestRouteSummaryLogsChangesEachIntervalAndTheTotals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nop := kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return nil })
		router, err := route.New([]route.Rule{{Expr: `value.kind == "a"`, Handler: nop}}, nil, route.ContentType("application/json"))
		if err != nil {
			t.Fatal(err)
		}
		e := &endpoints{router: router, handler: router, specs: []routeSpec{{`value.kind == "a"`, "http://127.0.0.1:1/a"}}}
		var out bytes.Buffer
		log := slog.New(slog.NewTextHandler(&out, nil))
		send := func(vs ...string) {
			for _, v := range vs {
				if err := e.Handle(t.Context(), &kgo.Record{Value: []byte(v)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		lines := func() []string { return strings.Split(strings.TrimSpace(out.String()), "\n") }

		stop := e.summarize(log, 10*time.Second, "kpar forward")
		send(`{"kind":"a"}`, `{"kind":"b"}`, `{"kind":"a"}`)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if l := lines(); len(l) != 1 || !strings.Contains(l[0], `filter and routes in the last 10s" filtered=1 route_1=2 expression_errors=0`) {
			t.Fatalf("after the first interval the log is:\n%s", out.String())
		}
		time.Sleep(10 * time.Second) // nothing happened
		synctest.Wait()
		if l := lines(); len(l) != 1 {
			t.Fatalf("a quiet interval was logged:\n%s", out.String())
		}
		send(`{"other":1}`)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if l := lines(); len(l) != 3 || !strings.Contains(l[1], "filtered=1 route_1=0 expression_errors=1") ||
			!strings.Contains(l[2], `level=WARN`) || !strings.Contains(l[2], `flag="--route 1"`) || !strings.Contains(l[2], `last_error="no such key: kind"`) {
			t.Fatalf("after a failed evaluation the log is:\n%s", out.String())
		}
		stop()
		if l := lines(); len(l) != 4 || !strings.Contains(l[3], `filter and routes, totals" filtered=2 route_1=2 expression_errors=1`) {
			t.Fatalf("after stop the log is:\n%s", out.String())
		}
	})
}

// TestForwardCheckConfigPrintsTheRoutes: the dry run compiles the
// expressions and prints them, with where unmatched records go.
func TestForwardCheckConfigPrintsTheRoutes(t *testing.T) {
	withoutKparEnv(t)
	var stdout, stderr bytes.Buffer
	code := cmdForward(t.Context(), []string{"--check-config", "--brokers", "127.0.0.1:1", "--group", "g", "--topic", "t",
		"--filter", `topic != "x"`, "--route", `value.kind == "a" -> http://127.0.0.1:1/a`}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{"  filter: topic != \"x\"\n", "  route_1: value.kind == \"a\" -> http://127.0.0.1:1/a\n", "  unrouted: filtered (no --url)\n"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
}
