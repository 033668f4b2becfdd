package route_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/route"
)

// recorder is a kpar.Handler that keeps the offsets it was given, and the
// decoded form the context carried for each.
type recorder struct {
	mu      sync.Mutex
	offsets []int64
	decoded []forward.Decoded
}

func (rc *recorder) Handle(ctx context.Context, r *kgo.Record) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.offsets = append(rc.offsets, r.Offset)
	if d, ok := forward.DecodedFrom(ctx, r); ok {
		rc.decoded = append(rc.decoded, d)
	}
	return nil
}

func (rc *recorder) got() []int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]int64(nil), rc.offsets...)
}

func jsonRecord(offset int64, value string) *kgo.Record {
	return &kgo.Record{
		Topic: "orders", Partition: 2, Offset: offset, Timestamp: time.Unix(1700000000, 0),
		Key:     []byte("k1"),
		Value:   []byte(value),
		Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/json")}},
	}
}

func mustNew(t *testing.T, rules []route.Rule, fallback kpar.Handler, opts ...route.Opt) *route.Handler {
	t.Helper()
	h, err := route.New(rules, fallback, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func handle(t *testing.T, h *route.Handler, rs ...*kgo.Record) {
	t.Helper()
	for _, r := range rs {
		if err := h.Handle(context.Background(), r); err != nil {
			t.Fatalf("offset %d: %v", r.Offset, err)
		}
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCompileErrorsNameTheRuleAndPosition(t *testing.T) {
	ok := route.Rule{Expr: "true", Handler: &recorder{}}
	for _, tc := range []struct {
		name        string
		filter      string
		rules       []route.Rule
		rule        int
		line, col   int
		msgContains string
	}{
		{"syntax error in the filter", `value.type == `, nil, 0, 1, 15, "Syntax error"},
		{"unknown variable in rule 2", `value.x == 1`, []route.Rule{ok, {Expr: `vaule.type == "a"`, Handler: &recorder{}}}, 2, 1, 1, "undeclared reference to 'vaule'"},
		{"type error", ``, []route.Rule{{Expr: `topic + 1 == 2`, Handler: &recorder{}}}, 1, 1, 7, "no matching overload"},
		{"not a bool", ``, []route.Rule{{Expr: `topic`, Handler: &recorder{}}}, 1, 1, 1, "want a bool"},
		{"second line", ``, []route.Rule{{Expr: "topic == \"a\" &&\n  partition == ", Handler: &recorder{}}}, 1, 2, 16, "Syntax error"},
		{"empty rule", ``, []route.Rule{{Expr: "  ", Handler: &recorder{}}}, 1, 1, 1, "empty expression"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []route.Opt
			if tc.filter != "" {
				opts = append(opts, route.Filter(tc.filter))
			}
			_, err := route.New(tc.rules, &recorder{}, opts...)
			var ce *route.CompileError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v, want a *CompileError", err)
			}
			if ce.Rule != tc.rule || ce.Line != tc.line || ce.Column != tc.col || !strings.Contains(ce.Msg, tc.msgContains) {
				t.Errorf("rule %d at %d:%d %q, want rule %d at %d:%d containing %q\n%v", ce.Rule, ce.Line, ce.Column, ce.Msg, tc.rule, tc.line, tc.col, tc.msgContains, err)
			}
			if !strings.Contains(err.Error(), "^") && tc.msgContains != "want a bool" && tc.msgContains != "empty expression" {
				t.Errorf("the error shows no caret under the position:\n%v", err)
			}
		})
	}
}

func TestFirstMatchingRuleWins(t *testing.T) {
	big, orders, rest := &recorder{}, &recorder{}, &recorder{}
	h := mustNew(t, []route.Rule{
		{Expr: `value.amount > 100`, Handler: big},
		{Expr: `value.type == "order"`, Handler: orders},
	}, rest, route.ContentType("application/json"))
	handle(t, h,
		jsonRecord(0, `{"type":"order","amount":500}`), // both match: the first wins
		jsonRecord(1, `{"type":"order","amount":5}`),
		jsonRecord(2, `{"type":"refund","amount":5}`),
		jsonRecord(3, `{"type":"refund","amount":1000.5}`),
	)
	if !equal(big.got(), []int64{0, 3}) || !equal(orders.got(), []int64{1}) || !equal(rest.got(), []int64{2}) {
		t.Errorf("big %v, orders %v, fallback %v; want [0 3], [1], [2]", big.got(), orders.got(), rest.got())
	}
	st := h.Stats()
	if st.Rules[0].Matched != 2 || st.Rules[1].Matched != 1 || st.Fallback != 1 || st.Filtered != 0 || st.Errors() != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestUnmatchedRecordsAreFilteredWithoutAFallback(t *testing.T) {
	orders := &recorder{}
	h := mustNew(t, []route.Rule{{Expr: `headers["type"] == "order"`, Handler: orders}}, nil)
	r0, r1 := jsonRecord(0, `{}`), jsonRecord(1, `{}`)
	r0.Headers = append(r0.Headers, kgo.RecordHeader{Key: "type", Value: []byte("order")})
	handle(t, h, r0, r1)
	if !equal(orders.got(), []int64{0}) {
		t.Errorf("routed %v, want [0]", orders.got())
	}
	if st := h.Stats(); st.Filtered != 1 || st.Errors() != 1 {
		// r1 has no "type" header: a failed evaluation, counted.
		t.Errorf("stats %+v, want 1 filtered and 1 error", st)
	}
}

func TestFilterLetsOnlyMatchingRecordsThrough(t *testing.T) {
	all := &recorder{}
	h := mustNew(t, nil, all, route.Filter(`value.country == "NL"`))
	handle(t, h, jsonRecord(0, `{"country":"NL"}`), jsonRecord(1, `{"country":"BE"}`), jsonRecord(2, `{"country":"NL"}`))
	if !equal(all.got(), []int64{0, 2}) {
		t.Errorf("sent %v, want [0 2]", all.got())
	}
	if st := h.Stats(); st.Filtered != 1 || st.Filter.Matched != 2 || st.Filter.Expr != `value.country == "NL"` {
		t.Errorf("stats %+v", st)
	}
}

func TestFilterRunsBeforeTheRules(t *testing.T) {
	a, rest := &recorder{}, &recorder{}
	h := mustNew(t, []route.Rule{{Expr: `offset % 2 == 0`, Handler: a}}, rest, route.Filter(`offset < 3`))
	handle(t, h, jsonRecord(0, `1`), jsonRecord(1, `1`), jsonRecord(2, `1`), jsonRecord(3, `1`), jsonRecord(4, `1`))
	if !equal(a.got(), []int64{0, 2}) || !equal(rest.got(), []int64{1}) {
		t.Errorf("rule %v, fallback %v; want [0 2], [1]", a.got(), rest.got())
	}
	if st := h.Stats(); st.Filtered != 2 {
		t.Errorf("filtered %d, want 2", st.Filtered)
	}
}

func TestMissingFieldsAreNoMatchAndCounted(t *testing.T) {
	a, rest := &recorder{}, &recorder{}
	h := mustNew(t, []route.Rule{
		{Expr: `value.customer.tier == "gold"`, Handler: a},
		{Expr: `has(value.customer) && value.customer.?tier.orValue("") == ""`, Handler: a},
	}, rest)
	handle(t, h,
		jsonRecord(0, `{"customer":{"tier":"gold"}}`),
		jsonRecord(1, `{"order":1}`),     // no customer: rule 1 fails, rule 2 is false
		jsonRecord(2, `{"customer":{}}`), // rule 1 fails, rule 2 matches
		jsonRecord(3, `not json`),        // both fail
	)
	if !equal(a.got(), []int64{0, 2}) || !equal(rest.got(), []int64{1, 3}) {
		t.Errorf("rules %v, fallback %v; want [0 2], [1 3]", a.got(), rest.got())
	}
	st := h.Stats()
	if st.Rules[0].Errors != 3 || st.Rules[1].Errors != 1 {
		t.Errorf("errors %d and %d, want 3 and 1 (%+v)", st.Rules[0].Errors, st.Rules[1].Errors, st)
	}
	if !strings.Contains(st.Rules[1].LastError, "not JSON") {
		t.Errorf("rule 2's last error %q, want it to say the value is not JSON", st.Rules[1].LastError)
	}
}

func TestValueIsJSONOnlyWhenTheContentTypeSaysJSON(t *testing.T) {
	for _, tc := range []struct {
		name, header, def string
		want              bool // value.n == 1 matched
		wantBytes         bool // value == b'{"n":1}' matched
	}{
		{"record header application/json", "application/json", "", true, false},
		{"record header with charset", "Application/JSON; charset=utf-8", "", true, false},
		{"record header +json", "application/cloudevents+json", "", true, false},
		{"--content-type application/json", "", "application/json", true, false},
		{"record header wins over --content-type", "text/plain", "application/json", false, true},
		{"no content type", "", "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			isN, isBytes, rest := &recorder{}, &recorder{}, &recorder{}
			var opts []route.Opt
			if tc.def != "" {
				opts = append(opts, route.ContentType(tc.def))
			}
			h := mustNew(t, []route.Rule{
				{Expr: `type(value) == bytes && value == b'{"n":1}'`, Handler: isBytes},
				{Expr: `value.n == 1`, Handler: isN},
			}, rest, opts...)
			r := &kgo.Record{Value: []byte(`{"n":1}`)}
			if tc.header != "" {
				r.Headers = []kgo.RecordHeader{{Key: "Content-Type", Value: []byte(tc.header)}}
			}
			handle(t, h, r)
			if got := len(isN.got()) == 1; got != tc.want {
				t.Errorf("value.n == 1: %v, want %v", got, tc.want)
			}
			if got := len(isBytes.got()) == 1; got != tc.wantBytes {
				t.Errorf("value is bytes: %v, want %v", got, tc.wantBytes)
			}
		})
	}
}

func TestRecordVariables(t *testing.T) {
	r := &kgo.Record{
		Topic: "payments", Partition: 3, Offset: 42, Timestamp: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
		Key:     []byte("customer-7"),
		Value:   []byte(`{"id":9007199254740993,"big":18446744073709551615,"price":9.5,"tags":["a","b"],"ok":true,"none":null}`),
		Headers: []kgo.RecordHeader{{Key: "source", Value: []byte("old")}, {Key: "source", Value: []byte("web")}},
	}
	for _, expr := range []string{
		`topic == "payments" && partition == 3 && offset == 42`,
		`timestamp == timestamp("2026-03-01T12:00:00Z") && timestamp > timestamp("2026-01-01T00:00:00Z")`,
		`key == "customer-7" && key.startsWith("customer-")`,
		`headers.source == "web" && !("other" in headers)`,
		`value.id == 9007199254740993 && value.id != 9007199254740992`, // exact above 2^53
		`value.big == 18446744073709551615u`,
		`value.price > 9 && value.price < 10 && value.price == 9.5`,
		`"b" in value.tags && size(value.tags) == 2`,
		`value.ok && value.none == null`,
		`value.id + 1 == 9007199254740994`, // an int, not a double
		`value.?customer.tier.orValue("none") == "none" && value.?price.orValue(0) == 9.5`,
		`headers.source.upperAscii() == "WEB" && key.split("-")[1] == "7"`,
		`value["price"] >= 9 && !has(value.customer)`,
	} {
		t.Run(expr, func(t *testing.T) {
			hit, miss := &recorder{}, &recorder{}
			h := mustNew(t, []route.Rule{{Expr: expr, Handler: hit}}, miss, route.ContentType("application/json"))
			handle(t, h, r)
			if len(hit.got()) != 1 {
				t.Errorf("no match: %+v", h.Stats().Rules[0])
			}
		})
	}
}

func TestKeyIsBytesUnlessUTF8AndNullWhenAbsent(t *testing.T) {
	hit, miss := &recorder{}, &recorder{}
	h := mustNew(t, []route.Rule{
		{Expr: `key == null`, Handler: hit},
		{Expr: `type(key) == bytes && key == b'\xff\x00'`, Handler: hit},
	}, miss)
	handle(t, h, &kgo.Record{Offset: 0}, &kgo.Record{Offset: 1, Key: []byte{0xff, 0}}, &kgo.Record{Offset: 2, Key: []byte("text")})
	if !equal(hit.got(), []int64{0, 1}) || !equal(miss.got(), []int64{2}) {
		t.Errorf("matched %v, not %v; want [0 1], [2]", hit.got(), miss.got())
	}
}

func TestTombstoneValueIsNull(t *testing.T) {
	hit := &recorder{}
	h := mustNew(t, []route.Rule{{Expr: `value == null`, Handler: hit}}, nil, route.ContentType("application/json"))
	handle(t, h, &kgo.Record{Key: []byte("k")}, &kgo.Record{Offset: 1, Value: []byte(`{}`)}, &kgo.Record{Offset: 2, Value: []byte(`null`)})
	if !equal(hit.got(), []int64{0, 2}) {
		t.Errorf("matched %v, want [0 2] (a tombstone, and JSON null)", hit.got())
	}
}

// decoder is a forward.Decoder that turns "avro:<json>" into <json>.
type decoder struct {
	calls atomic.Int64
	err   error
}

func (d *decoder) Decode(_ context.Context, r *kgo.Record) (forward.Decoded, error) {
	d.calls.Add(1)
	if d.err != nil {
		return forward.Decoded{}, d.err
	}
	out := forward.Decoded{Value: r.Value, ValueForm: forward.FormRaw}
	if v, ok := strings.CutPrefix(string(r.Value), "avro:"); ok {
		out = forward.Decoded{Value: []byte(v), ValueForm: forward.FormAvro, ValueSchemaID: 7}
	}
	if k, ok := strings.CutPrefix(string(r.Key), "avro:"); ok {
		out.Key, out.KeyForm, out.KeySchemaID = []byte(k), forward.FormAvro, 8
	}
	return out, nil
}

func TestDecodedOnceAndHandedOn(t *testing.T) {
	dec := &decoder{}
	hit, miss := &recorder{}, &recorder{}
	h := mustNew(t, []route.Rule{
		{Expr: `value.kind == "x"`, Handler: miss},
		{Expr: `value.kind == "y" && key.id == 5`, Handler: hit},
	}, miss, route.Decoder(dec))
	// Binary with no content type: only the Decoder makes it JSON.
	handle(t, h, &kgo.Record{Key: []byte(`avro:{"id":5}`), Value: []byte(`avro:{"kind":"y"}`)})
	if len(hit.got()) != 1 || len(miss.got()) != 0 {
		t.Fatalf("routed %v / %v, want the second rule", hit.got(), miss.got())
	}
	if n := dec.calls.Load(); n != 1 {
		t.Errorf("decoded %d times for two rules, want once", n)
	}
	if len(hit.decoded) != 1 || hit.decoded[0].ValueSchemaID != 7 || string(hit.decoded[0].Value) != `{"kind":"y"}` {
		t.Errorf("the handler's context carried %+v, want the decoded record", hit.decoded)
	}
}

func TestNotDecodedWhenNoExpressionReadsTheRecord(t *testing.T) {
	dec := &decoder{}
	hit := &recorder{}
	h := mustNew(t, nil, hit, route.Filter(`topic == "orders"`), route.Decoder(dec))
	handle(t, h, jsonRecord(0, `avro:{}`), &kgo.Record{Topic: "other"})
	if n := dec.calls.Load(); n != 0 {
		t.Errorf("decoded %d times, want none: the handler decodes what it sends", n)
	}
	if len(hit.got()) != 1 || len(hit.decoded) != 0 {
		t.Errorf("sent %v with decoded %v, want one record, not decoded", hit.got(), hit.decoded)
	}
}

func TestRawDecodedValueFollowsTheContentType(t *testing.T) {
	hit := &recorder{}
	h := mustNew(t, []route.Rule{{Expr: `value.plain == true`, Handler: hit}}, nil, route.Decoder(&decoder{}))
	handle(t, h, jsonRecord(0, `{"plain":true}`)) // not in the wire format: raw, but the header says JSON
	if len(hit.got()) != 1 {
		t.Errorf("no match: %+v", h.Stats())
	}
}

func TestDecoderErrorsAreTheRecords(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		is   func(error) bool
	}{
		{"registry down holds the record", kpar.Overloaded(errors.New("registry: connection refused")), kpar.IsOverloaded},
		{"unknown schema dead-letters it", kpar.Permanent(errors.New("schema not found")), kpar.IsPermanent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hit := &recorder{}
			// value.x fails to evaluate on its own too; || would absorb
			// that error, not the Decoder's.
			h := mustNew(t, []route.Rule{{Expr: `value.x == 1 || true`, Handler: hit}}, hit, route.Decoder(&decoder{err: tc.err}))
			err := h.Handle(context.Background(), jsonRecord(0, `{}`))
			if !tc.is(err) {
				t.Errorf("Handle returned %v, want the Decoder's error", err)
			}
			if st := h.Stats(); len(hit.got()) != 0 || st.Filtered != 0 || st.Errors() != 0 {
				t.Errorf("sent %v, stats %+v: want nothing sent, filtered or counted", hit.got(), st)
			}
		})
	}
}

func TestHandlerErrorsPassThrough(t *testing.T) {
	boom := kpar.Permanent(errors.New("422"))
	h := mustNew(t, []route.Rule{{Expr: `true`, Handler: kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return boom })}}, nil)
	if err := h.Handle(context.Background(), jsonRecord(0, `{}`)); !errors.Is(err, boom) {
		t.Errorf("Handle returned %v, want the rule's handler's error", err)
	}
}

func TestNewRefusesNothingToDo(t *testing.T) {
	if _, err := route.New(nil, nil); err == nil {
		t.Error("New with no rule, filter or fallback succeeded; every record would be filtered")
	}
	if _, err := route.New([]route.Rule{{Expr: "true"}}, nil); err == nil {
		t.Error("New took a rule without a handler")
	}
}

func TestConcurrentHandling(t *testing.T) {
	a, b := &recorder{}, &recorder{}
	h := mustNew(t, []route.Rule{{Expr: `value.n % 2 == 0`, Handler: a}}, b, route.ContentType("application/json"))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				n := int64(g*200 + i)
				r := &kgo.Record{Offset: n, Value: []byte(`{"n":` + itoa(n) + `}`)}
				if err := h.Handle(context.Background(), r); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if len(a.got()) != 800 || len(b.got()) != 800 {
		t.Errorf("%d even and %d odd, want 800 each", len(a.got()), len(b.got()))
	}
	for _, o := range a.got() {
		if o%2 != 0 {
			t.Fatalf("odd offset %d routed as even", o)
		}
	}
}

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}

func TestARetriedRecordCountsOnceItsOutcomeIsFinal(t *testing.T) {
	fails := 2
	flaky := kpar.HandlerFunc(func(context.Context, *kgo.Record) error {
		if fails > 0 {
			fails--
			return kpar.Overloaded(errors.New("503"))
		}
		return nil
	})
	refused := kpar.HandlerFunc(func(context.Context, *kgo.Record) error { return kpar.Permanent(errors.New("422")) })
	h := mustNew(t, []route.Rule{
		{Expr: `value.n == 1`, Handler: flaky},
		{Expr: `value.n == 2`, Handler: refused},
	}, nil, route.ContentType("application/json"), route.Filter(`value.n > 0 || value.missing`))
	one := &kgo.Record{Value: []byte(`{"n":1}`)}
	for attempt := 1; ; attempt++ {
		err := h.Handle(context.Background(), one)
		if err == nil {
			break
		}
		if st := h.Stats(); st.Rules[0].Matched != 0 || st.Filter.Matched != 0 {
			t.Fatalf("attempt %d failed (%v) and was counted: %+v", attempt, err, st)
		}
	}
	if err := h.Handle(context.Background(), &kgo.Record{Value: []byte(`{"n":2}`)}); !kpar.IsPermanent(err) {
		t.Fatalf("the refused record returned %v", err)
	}
	// n 0: the filter's left side is false and its right side fails.
	handle(t, h, &kgo.Record{Value: []byte(`{"n":0}`)})
	st := h.Stats()
	if st.Filter.Matched != 2 || st.Rules[0].Matched != 1 || st.Rules[1].Matched != 1 || st.Filtered != 1 || st.Filter.Errors != 1 {
		t.Errorf("stats %+v; want the filter passing 2 records, each rule 1, 1 filtered with 1 error", st)
	}
}
