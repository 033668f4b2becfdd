package route

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/forward"
)

// Rule sends the records its expression is true for to its Handler.
type Rule struct {
	Expr    string // a CEL expression of the variables in the package documentation, of type bool
	Handler kpar.Handler
}

// Handler is a kpar.Handler that evaluates the filter, then the rules in
// order, and calls the handler of the first rule that matches (else the
// fallback; without one, the record is filtered and finishes). It is safe
// for concurrent use.
type Handler struct {
	filter   *program // nil without Filter
	rules    []rule
	fallback kpar.Handler // nil: unmatched records are filtered
	decoder  forward.Decoder
	// jsonDefault says whether records without a content-type header
	// hold JSON (ContentType).
	jsonDefault bool

	filtered      atomic.Uint64
	fallbackCount atomic.Uint64
	pool          sync.Pool // *activation
}

type rule struct {
	*program
	h kpar.Handler
}

var _ kpar.Handler = (*Handler)(nil)

// New compiles the filter and the rules' expressions and returns their
// Handler. fallback handles the records no rule matches; nil filters them.
// An expression that does not parse or type-check, or is not a bool, is a
// *CompileError.
func New(rules []Rule, fallback kpar.Handler, opts ...Opt) (*Handler, error) {
	c := defaultCfg()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	env, err := newEnv()
	if err != nil {
		return nil, fmt.Errorf("route: the CEL environment: %w", err)
	}
	h := &Handler{
		fallback:    fallback,
		decoder:     c.decoder,
		jsonDefault: isJSON(c.contentType),
	}
	h.pool.New = func() any { return &activation{h: h} }
	if c.filter != "" {
		if h.filter, err = compile(env, c.filter, 0); err != nil {
			return nil, err
		}
	}
	for i, r := range rules {
		if r.Handler == nil {
			return nil, fmt.Errorf("route: rule %d (%q) has no handler", i+1, r.Expr)
		}
		p, err := compile(env, r.Expr, i+1)
		if err != nil {
			return nil, err
		}
		h.rules = append(h.rules, rule{p, r.Handler})
	}
	if h.filter == nil && len(h.rules) == 0 && fallback == nil {
		return nil, errors.New("route: no rule and no fallback: every record would be filtered; give a rule or a fallback handler")
	}
	return h, nil
}

// Handle routes r: it returns nil at once for a filtered record, the
// Decoder's error when an expression needed the decoded record and it
// could not be decoded, and otherwise what the chosen handler returns.
func (h *Handler) Handle(ctx context.Context, r *kgo.Record) error {
	a := h.pool.Get().(*activation)
	defer h.release(a)
	a.ctx, a.r = ctx, r
	next, err := h.choose(a)
	switch {
	case err != nil:
		// Held (the registry is down) or dead-lettered for it; the
		// evaluations it cut short are not counted.
		return err
	case next == nil:
		h.count(a)
		h.filtered.Add(1)
		return nil
	case a.decoded:
		ctx = forward.WithDecoded(ctx, r, a.d)
	}
	err = next.Handle(ctx, r)
	if err == nil || kpar.IsPermanent(err) {
		// The record's last attempt: count it once, however many
		// attempts before failed.
		h.count(a)
	}
	return err
}

// choose returns the handler for a's record, nil when it is filtered, and
// notes in a what matched and what failed, for count.
func (h *Handler) choose(a *activation) (kpar.Handler, error) {
	if h.filter != nil {
		ok, err := h.filter.eval(a)
		if err != nil || !ok {
			return nil, err
		}
		a.passed = true
	}
	for i := range h.rules {
		ok, err := h.rules[i].eval(a)
		if err != nil {
			return nil, err
		}
		if ok {
			a.chosen = h.rules[i].program
			return h.rules[i].h, nil
		}
	}
	return h.fallback, nil
}

// count adds a's record to the counts.
func (h *Handler) count(a *activation) {
	if a.passed {
		h.filter.matched.Add(1)
	}
	switch {
	case a.chosen != nil:
		a.chosen.matched.Add(1)
	case h.fallback != nil && (h.filter == nil || a.passed):
		h.fallbackCount.Add(1)
	}
	for _, f := range a.fails {
		f.p.failed(f.msg)
	}
}

func (h *Handler) release(a *activation) {
	a.reset()
	h.pool.Put(a)
}
