package main

import (
	"strconv"
	"strings"
	"sync"
)

// ledger records every successful handling of the demo's records. Record i
// has key i mod keys and sequence number i / keys within its key, so the
// value "key=<k> seq=<n>" names record n*keys + k.
type ledger struct {
	keys  int
	total int
	all   chan struct{} // closed once every record was handled

	mu         sync.Mutex // guards the fields below; handlers call in concurrently
	times      []uint32   // successful handlings per record
	next       []int      // per key: the lowest sequence number not handled yet
	distinct   int64      // records handled at least once
	duplicates int64      // successful handlings after a record's first
	violations int64      // first handlings that overtook an earlier record of their key
}

func newLedger(records, keys int) *ledger {
	return &ledger{
		keys:  keys,
		total: records,
		all:   make(chan struct{}),
		times: make([]uint32, records),
		next:  make([]int, keys),
	}
}

// handled records a successful handling of the record with this value.
// Values the demo did not produce are ignored.
func (l *ledger) handled(value []byte) {
	key, seq, ok := parseDemoValue(value)
	if !ok || key >= l.keys || seq >= l.total || seq*l.keys+key >= l.total {
		return
	}
	i := seq*l.keys + key
	l.mu.Lock()
	defer l.mu.Unlock()
	l.times[i]++
	if l.times[i] > 1 {
		l.duplicates++
		return
	}
	l.distinct++
	if seq != l.next[key] { // an earlier record of this key is not handled yet
		l.violations++
	}
	for n := l.next[key]; ; n++ {
		if j := n*l.keys + key; j >= l.total || l.times[j] == 0 {
			l.next[key] = n
			break
		}
	}
	if l.distinct == int64(l.total) {
		close(l.all)
	}
}

func (l *ledger) counts() (handled, duplicates, violations int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.distinct, l.duplicates, l.violations
}

// parseDemoValue parses "key=<k> seq=<n>".
func parseDemoValue(v []byte) (key, seq int, ok bool) {
	k, s, ok := strings.Cut(string(v), " ")
	if !ok {
		return 0, 0, false
	}
	k, ok1 := strings.CutPrefix(k, "key=")
	s, ok2 := strings.CutPrefix(s, "seq=")
	key, err1 := strconv.Atoi(k)
	seq, err2 := strconv.Atoi(s)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || key < 0 || seq < 0 {
		return 0, 0, false
	}
	return key, seq, true
}
