// Package retry is the room of kpar's engine where failed records wait
// for their next attempt: on a backoff, each with the timer the engine
// armed for it, or in the exile queue, for the exile writer that moves
// them to their next retry topic or to the dead-letter sink. It also
// names the retry topics (<topic>.retry.<n>) and reads a topic's level
// back, and spaces out the writes to a failing retry topic or sink
// (Topics).
//
// A waiting record keeps its lane and stays unfinished: later records of
// its key (or partition) wait for it, and the commit stays below it. The
// engine arms a timer per waiting record and hands it to Wait; when the
// timer fires, Due says whether the record still waits (it was not
// forgotten meanwhile: its partition was revoked, or a share group
// withdrew it), and only then does the engine make it ready. Forget takes
// records out early, handing back their timers to stop.
//
// Invariants: a record waits at most once (a second Wait replaces its
// timer); Due and Forget remove a record, so Due reports true at most
// once per Wait; Waiting counts the records between Wait and their Due or
// Forget; TakeExiled returns every exiled record once, in the order they
// were exiled, and leaves the queue empty; LevelOf(Name(t, n)) is n for a
// consumed topic t and 1 <= n <= the levels, and LevelOf is 0 for any
// other name. Room is pure: no goroutines, no lock (the engine's mu
// guards it), no clock; the timers are the engine's, never called here.
// Topics is read-only once made, and is read without a lock.
package retry

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Room is the records waiting to be retried, T, with their timers, W, and
// the exile queue.
type Room[T comparable, W any] struct {
	waiting map[T]W
	exiled  []T
}

// New returns an empty room.
func New[T comparable, W any]() Room[T, W] {
	return Room[T, W]{waiting: make(map[T]W)}
}

// Wait records that t waits for a retry on w.
func (r *Room[T, W]) Wait(t T, w W) { r.waiting[t] = w }

// Due takes t out of the waiting records when its timer fired, and
// reports whether it still waited: false when Forget took it first.
func (r *Room[T, W]) Due(t T) bool {
	if _, ok := r.waiting[t]; !ok {
		return false
	}
	delete(r.waiting, t)
	return true
}

// Forget takes the waiting records that match selects out of the room,
// handing each with its timer to each (which may stop the timer and make
// the record ready at once, or drop it).
func (r *Room[T, W]) Forget(match func(T) bool, each func(T, W)) {
	for t, w := range r.waiting {
		if match == nil || match(t) {
			delete(r.waiting, t)
			each(t, w)
		}
	}
}

// Waiting is how many records wait on a timer.
func (r *Room[T, W]) Waiting() int { return len(r.waiting) }

// Exile queues t for the exile writer.
func (r *Room[T, W]) Exile(t T) { r.exiled = append(r.exiled, t) }

// TakeExiled returns the exile queue, oldest first, and empties it.
func (r *Room[T, W]) TakeExiled() []T {
	q := r.exiled
	r.exiled = nil
	return q
}

// Find returns a record, waiting or exiled, that match selects.
func (r *Room[T, W]) Find(match func(T) bool) (T, bool) {
	for t := range r.waiting {
		if match(t) {
			return t, true
		}
	}
	for _, t := range r.exiled {
		if match(t) {
			return t, true
		}
	}
	var zero T
	return zero, false
}

// Name names the n-th retry topic (from 1) of topic.
func Name(topic string, n int) string { return topic + ".retry." + strconv.Itoa(n) }

// Topics is the retry topics of a consumer, and the pace of writes to a
// failing one: set by NewTopics and never changed, so that it needs no
// lock.
type Topics struct {
	topics   []string // the topics consumed, whose retry topics these are
	levels   int      // retry topics per topic
	retryMax time.Duration
}

// NewTopics returns the retry topics of topics, levels of them each;
// retryMax is RetryBackoff's cap, which bounds SinkBackoff.
func NewTopics(topics []string, levels int, retryMax time.Duration) Topics {
	return Topics{topics: append([]string(nil), topics...), levels: max(levels, 0), retryMax: retryMax}
}

// Levels is how many retry topics each topic has.
func (r Topics) Levels() int { return r.levels }

// LevelOf returns n when topic is the n-th retry topic of a consumed
// topic, else 0.
func (r Topics) LevelOf(topic string) int {
	if r.levels == 0 {
		return 0
	}
	i := strings.LastIndex(topic, ".retry.")
	if i < 0 {
		return 0
	}
	n, err := strconv.Atoi(topic[i+len(".retry."):])
	if err != nil || n < 1 || n > r.levels {
		return 0
	}
	for _, t := range r.topics {
		if t == topic[:i] {
			return n
		}
	}
	return 0
}

// Consumed is what the client subscribes to: the topics and each topic's
// retry topics.
func (r Topics) Consumed() []string {
	ts := append([]string(nil), r.topics...)
	for _, t := range r.topics {
		for n := range r.levels {
			ts = append(ts, Name(t, n+1))
		}
	}
	return ts
}

// SinkBackoff spaces out writes to a failing retry topic or sink: the
// wait before the write after attempt failed ones, jittered over its
// upper half, from 100ms doubling up to RetryBackoff's cap (at least 1s).
func (r Topics) SinkBackoff(attempt int) time.Duration {
	base, ceiling := 100*time.Millisecond, max(r.retryMax, time.Second)
	d, attempt := ceiling, max(attempt, 1)
	if attempt < 20 {
		d = min(base<<(attempt-1), ceiling)
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
