// Package throttle holds the token buckets behind kpar's rate limits: one
// Bucket for attempt starts across a consumer, and Keys, a bounded table of
// buckets for starts per record key.
//
// Why not golang.org/x/time/rate: kpar's root package links only the
// standard library and franz-go, and the engine needs less than rate gives
// and one thing it does not: a bucket that reads the time it is handed
// (so the engine's tests run in testing/synctest's virtual time and these
// tests need no clock at all), that owns no mutex (the engine's lock
// already guards it), and a table of buckets per key that stays within a
// fixed size however many keys pass. A bucket is a few lines of arithmetic;
// the table is the part worth testing.
//
// Everything here is a pure data structure: no goroutines, no clock of its
// own, not safe for concurrent use; the caller passes the time and holds
// its lock.
package throttle

import (
	"math"
	"time"
)

// Bucket is a token bucket: it holds up to burst tokens, gains perSecond
// tokens a second, and each start takes one. The zero value is not
// usable; use NewBucket.
type Bucket struct {
	perSecond float64
	burst     float64
	tokens    float64   // may be negative: tokens owed by reservations and batches
	last      time.Time // when tokens was last brought up to date; zero before the first use
}

// NewBucket returns a full bucket. perSecond must be above 0 and burst at
// least 1 (the callers validate).
func NewBucket(perSecond float64, burst int) Bucket {
	return Bucket{perSecond: perSecond, burst: float64(burst), tokens: float64(burst)}
}

// refill brings tokens up to now. Time going backwards (a caller's clock
// reading older than the last one) adds nothing.
func (b *Bucket) refill(now time.Time) {
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens = math.Min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.perSecond)
	}
	if b.last.IsZero() || now.After(b.last) {
		b.last = now
	}
}

// Ready reports whether a start may happen now, and when it may not, how
// long until it may. It takes nothing.
func (b *Bucket) Ready(now time.Time) (ok bool, wait time.Duration) {
	b.refill(now)
	if b.tokens >= 1 {
		return true, 0
	}
	return false, b.until(1)
}

// Take takes n tokens now, whatever the bucket holds: a batch of n starts
// that passed Ready leaves the bucket owing what it lacked, and the starts
// that follow wait for the debt too, so the rate holds on average.
func (b *Bucket) Take(now time.Time, n int) {
	b.refill(now)
	b.tokens -= float64(n)
}

// Reserve takes one token now and returns how long until the start it
// pays for may happen: 0 when the bucket had a token, else the time until
// the bucket has refilled what this and earlier reservations owe. A caller
// that waits that long keeps to the rate without asking again, and the
// starts it reserved happen one after the other, not all at once.
func (b *Bucket) Reserve(now time.Time) (wait time.Duration) {
	b.refill(now)
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return b.until(0)
}

// until is how long until tokens reaches want at the current rate.
func (b *Bucket) until(want float64) time.Duration {
	d := time.Duration(math.Ceil((want - b.tokens) / b.perSecond * float64(time.Second)))
	return max(d, time.Nanosecond)
}

// Full reports whether the bucket holds burst tokens at now: it is then
// the same as a fresh one, and forgetting it loses nothing.
func (b *Bucket) Full(now time.Time) bool {
	b.refill(now)
	return b.tokens >= b.burst
}
