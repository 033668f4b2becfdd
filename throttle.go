package kpar

import (
	"fmt"
	"hash/maphash"
	"math"
	"time"

	"github.com/kpar/kpar/internal/throttle"
)

// keyBuckets bounds the per-key buckets of KeyRateLimit (see there).
const keyBuckets = 1 << 16

// rateSpec is a rate limit as given to RateLimit or KeyRateLimit.
type rateSpec struct {
	perSecond float64
	burst     int
	on        bool
}

func (r rateSpec) check(name string) error {
	switch {
	case !r.on:
		return nil
	case !(r.perSecond > 0) || math.IsInf(r.perSecond, 1):
		return fmt.Errorf("kpar: %s(%v, %d): perSecond out of range: want a rate above 0 (0.5 is one start every 2s); leave the option out for no limit", name, r.perSecond, r.burst)
	case r.burst < 1:
		return fmt.Errorf("kpar: %s(%v, %d): burst out of range: want 1 or more (1 spaces starts evenly)", name, r.perSecond, r.burst)
	}
	return nil
}

// rates are the rate limits of one Run. Every field is guarded by
// engine.mu.
//
// The global bucket gates take the way the adaptive limit does: a worker
// finding it empty arms the engine's one wake-up timer (limitWake) and
// waits. A record whose key is out of tokens reserves its key's next token
// and is set aside on a retry timer until that token is due (keyPaid marks
// it, so take lets it through then without asking again): no goroutine and
// no worker per waiting record, and the records of a hot key get distinct
// due times instead of all waking at once.
type rates struct {
	global *throttle.Bucket // nil when RateLimit is off
	keys   *throttle.Keys   // nil when KeyRateLimit is off
}

// newRates returns the rate limits of c, nil when neither is on.
func newRates(c *cfg) *rates {
	if !c.rateLimit.on && !c.keyRateLimit.on {
		return nil
	}
	r := new(rates)
	if s := c.rateLimit; s.on {
		b := throttle.NewBucket(s.perSecond, s.burst)
		r.global = &b
	}
	if s := c.keyRateLimit; s.on {
		r.keys = throttle.NewKeys(s.perSecond, s.burst, keyBuckets)
	}
	return r
}

// throttled reports whether the global rate limit or the overload breaker
// lets no attempt start now, arming the wake-up for when one may. Called
// with mu held.
func (e *engine) throttled() bool {
	global := e.rate != nil && e.rate.global != nil
	open := e.brk != nil && e.brk.Open()
	if !open && !global {
		return false // the common case: no clock read per record
	}
	now := time.Now()
	ok, wait := true, time.Duration(0)
	if open {
		ok, wait = e.brk.Allow(now, e.active)
	}
	if ok && global {
		ok, wait = e.rate.global.Ready(now)
	}
	if ok {
		return false
	}
	if wait > 0 && e.limitWake == nil {
		e.limitWake = time.AfterFunc(wait, func() {
			e.mu.Lock()
			e.limitWake = nil
			e.wake(1)
			e.mu.Unlock()
		})
	}
	return true
}

// started charges n attempt starts to the global rate limit. Called with
// mu held.
func (e *engine) started(n int) {
	if e.rate != nil && e.rate.global != nil && n > 0 {
		e.rate.global.Take(time.Now(), n)
	}
}

// keyWait reports whether t must wait for its key's rate limit, and then
// sets it aside until its token is due. Called with mu held.
func (e *engine) keyWait(t *task) bool {
	if e.rate == nil || e.rate.keys == nil {
		return false
	}
	it := &t.Value
	if it.x != nil && it.x.keyPaid {
		it.x.keyPaid = false // its reserved token is due now
		return false
	}
	k := it.original().Key
	if k == nil {
		return false
	}
	h := it.lane // hashed by prepare, outside the lock
	if it.x != nil && it.x.origin != nil {
		h = maphash.Bytes(e.seed, k) // a retry-topic record: its original's key
	}
	wait := e.rate.keys.Reserve(time.Now(), h)
	if wait <= 0 {
		return false
	}
	it.ext().keyPaid = true
	e.retryLater(t, wait)
	return true
}

// RateLimits is a snapshot of the rate limits of a Consumer, for status
// pages.
type RateLimits struct {
	// PerSecond and Burst are RateLimit's; PerSecond is 0 when it is off.
	PerSecond float64
	Burst     int
	// KeyPerSecond and KeyBurst are KeyRateLimit's; KeyPerSecond is 0
	// when it is off. Keys counts the keys that have a bucket now.
	KeyPerSecond float64
	KeyBurst     int
	Keys         int
}

// RateLimits returns the Consumer's rate limits (RateLimit, KeyRateLimit)
// and how many keys have a bucket now.
func (c *Consumer) RateLimits() RateLimits {
	r := RateLimits{}
	if s := c.cfg.rateLimit; s.on {
		r.PerSecond, r.Burst = s.perSecond, s.burst
	}
	if s := c.cfg.keyRateLimit; s.on {
		r.KeyPerSecond, r.KeyBurst = s.perSecond, s.burst
	}
	c.mu.Lock()
	e := c.eng
	c.mu.Unlock()
	if e == nil {
		return r
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.rate != nil && e.rate.keys != nil {
		r.Keys = e.rate.keys.Len()
	}
	return r
}
