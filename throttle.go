package kpar

import (
	"fmt"
	"hash/maphash"
	"math"
	"time"

	"github.com/kpar/kpar/internal/limits"
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

// newLimits is the limits room of c's configuration (internal/limits).
//
// The global bucket gates take the way the adaptive limit does: a worker
// finding it empty arms the engine's one wake-up timer (limitWake, see
// limited) and waits. A record whose key is out of tokens reserves its
// key's next token and is set aside on a retry timer until that token is
// due (keyPaid marks it, so take lets it through then without asking
// again): no goroutine and no worker per waiting record.
func newLimits(c *cfg) limits.Gate {
	lc := limits.Config{Concurrency: c.concurrency, Adaptive: c.adaptive, KeyBuckets: keyBuckets}
	if s := c.rateLimit; s.on {
		lc.Rate = limits.Rate{PerSecond: s.perSecond, Burst: s.burst}
	}
	if s := c.keyRateLimit; s.on {
		lc.KeyRate = limits.Rate{PerSecond: s.perSecond, Burst: s.burst}
	}
	return limits.New(lc)
}

// keyWait reports whether t must wait for its key's rate limit, and then
// sets it aside until its token is due. Called with mu held.
func (e *engine) keyWait(t *task) bool {
	if !e.limits.Keyed() {
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
	wait := e.limits.KeyWait(time.Now(), h)
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
	r.Keys = e.limits.Keys()
	return r
}
