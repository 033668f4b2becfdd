package route

// Stats counts the records a Handler finished with since it was made:
// each is counted once its outcome is final, filtered or handled (nil) or
// refused for good (a kpar.Permanent error); an attempt whose handler
// failed otherwise counts nothing, since the record is routed again on its
// next attempt. (A record that exhausts its attempts on such errors is
// dead-lettered without being counted.)
type Stats struct {
	// Filtered is the records that finished without a request: the
	// filter was false (or failed), or no rule matched and there is no
	// fallback.
	Filtered uint64
	// Fallback is the records no rule matched, sent to the fallback.
	Fallback uint64
	// Filter is the filter's counts (Matched: the records it let
	// through); its Expr is "" without Filter.
	Filter ExprStats
	// Rules is each rule's counts, in order.
	Rules []ExprStats
}

// ExprStats counts what one expression did.
type ExprStats struct {
	Expr    string
	Matched uint64 // records it was true for (a rule: that it sent)
	// Errors is the records it failed on (a missing field, a value that
	// is not JSON), each counted as false; LastError is the latest's
	// message.
	Errors    uint64
	LastError string
}

// Errors is the failed evaluations, over the filter and every rule.
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
