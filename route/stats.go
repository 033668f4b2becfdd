package route

// Stats counts what a Handler did since it was made. An expression is
// evaluated on each attempt of a record, so a record whose handler failed
// and was retried counts again in Matched and Errors; Filtered and
// Fallback count what returned without, or went to, the fallback the same
// way, and a filtered record is never retried.
type Stats struct {
	// Filtered is the records that finished without a request: the
	// filter was false (or failed), or no rule matched and there is no
	// fallback.
	Filtered uint64
	// Fallback is the records no rule matched, sent to the fallback.
	Fallback uint64
	// Filter is the filter's counts; its Expr is "" without Filter.
	Filter ExprStats
	// Rules is each rule's counts, in order.
	Rules []ExprStats
}

// ExprStats counts the evaluations of one expression.
type ExprStats struct {
	Expr    string
	Matched uint64 // evaluations that were true
	// Errors is the evaluations that failed (a missing field, a value
	// that is not JSON), each counted as false; LastError is the latest's
	// message.
	Errors    uint64
	LastError string
}

// Errors is the evaluations that failed, over the filter and every rule.
func (s Stats) Errors() uint64 {
	n := s.Filter.Errors
	for _, r := range s.Rules {
		n += r.Errors
	}
	return n
}

// Stats returns the counts so far. It is safe to call while records are
// handled; the counts are read one by one, not as one snapshot.
func (h *Handler) Stats() Stats {
	s := Stats{
		Filtered: h.filtered.Load(),
		Fallback: h.fallbackCount.Load(),
		Rules:    make([]ExprStats, len(h.rules)),
	}
	if h.filter != nil {
		s.Filter = h.filter.stats()
	}
	for i := range h.rules {
		s.Rules[i] = h.rules[i].stats()
	}
	return s
}

func (p *program) stats() ExprStats {
	s := ExprStats{Expr: p.expr, Matched: p.matched.Load(), Errors: p.errors.Load()}
	if e := p.lastErr.Load(); e != nil {
		s.LastError = *e
	}
	return s
}
