package kparprom

import (
	"sync"
	"time"
	"unicode/utf8"
)

// DeadLetterEntry is one dead-lettered record as the status page shows it.
type DeadLetterEntry struct {
	Time      time.Time `json:"time"` // when the hook reported it
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Class     string    `json:"class"` // permanent, exhausted, timeout or panic
	Attempts  int       `json:"attempts"`
	Error     string    `json:"error"` // the last error's text, cut to 500 bytes
}

// maxErrorText bounds the error text kept per entry: a panic's message can
// carry a whole stack.
const maxErrorText = 500

// RecentDeadLetters returns the latest dead letters, newest first, at most
// as many as the RecentDeadLetters option says (default 50).
func (m *Metrics) RecentDeadLetters() []DeadLetterEntry { return m.dead.list() }

// deadLetterRing keeps the latest max entries.
type deadLetterRing struct {
	max int

	mu      sync.Mutex // guards the fields below
	entries []DeadLetterEntry
	next    int // where the next entry goes once entries is full
}

func (r *deadLetterRing) add(e DeadLetterEntry) {
	if r.max == 0 {
		return
	}
	if len(e.Error) > maxErrorText {
		n := maxErrorText
		for n > 0 && !utf8.RuneStart(e.Error[n]) {
			n--
		}
		e.Error = e.Error[:n] + "…"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) < r.max {
		r.entries = append(r.entries, e)
		return
	}
	r.entries[r.next] = e
	r.next = (r.next + 1) % r.max
}

func (r *deadLetterRing) list() []DeadLetterEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]DeadLetterEntry, 0, len(r.entries))
	// Oldest is at next once the ring is full (next is 0 until then).
	for i := len(r.entries) - 1; i >= 0; i-- {
		out = append(out, r.entries[(r.next+i)%len(r.entries)])
	}
	return out
}
