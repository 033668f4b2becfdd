package kpar

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/kpar/kpar/internal/awake"
)

// TestAwakeCapHoldsWakeUpsAndTheGuardCountsStuckWorkers: while the handler
// is cheap, no wake-up goes beyond the cap; when the awake workers have
// each run one record for two ticks, the stuck guard stops counting them
// and wakes a sleeper for the records that wait. (The same with a real
// consumer and blocking handlers is
// TestBlockedAfterCheapRecordsHoldBackNoOthers.)
func TestAwakeCapHoldsWakeUpsAndTheGuardCountsStuckWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const workers = 8
		e := testEngine(func(c *cfg) { c.concurrency = workers })
		e.awake = awake.New(2)
		e.mu.Lock()
		for range workers - 2 { // two awake: the cap
			e.awake.Sleep()
		}
		e.wake(1)
		if e.awake.Idle() != workers-3 {
			t.Fatalf("before any measurement: idle %d, want a worker woken", e.awake.Idle())
		}
		e.awake.Woken() // the woken worker runs, and sleeps again
		e.awake.Sleep()

		e.cost.Measured(time.Microsecond) // cheap
		e.wake(1)
		if e.awake.Idle() != workers-2 || e.awake.Held() != 1 || e.guard == nil {
			t.Fatalf("cheap: idle %d, held %d, guard armed %v; want no worker woken, one held back, the guard armed",
				e.awake.Idle(), e.awake.Held(), e.guard != nil)
		}
		// The two awake workers each run one record, taken at this tick,
		// and one more record waits.
		for slot := range 2 {
			e.running[slot] = slotRecord{&task{}, e.awake.Stamp()}
		}
		e.ready.Push(&task{})
		e.mu.Unlock()

		check := func(wantStuck, wantIdle int) {
			t.Helper()
			time.Sleep(awake.Tick)
			synctest.Wait()
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.awake.StuckCount() != wantStuck || e.awake.Idle() != wantIdle {
				t.Fatalf("tick %d: %d stuck, idle %d; want %d stuck, idle %d", e.awake.Stamp(), e.awake.StuckCount(), e.awake.Idle(), wantStuck, wantIdle)
			}
		}
		check(0, workers-2) // one tick: not stuck yet, the guard re-armed
		check(2, workers-3) // two ticks: both stuck, a sleeper woken

		e.mu.Lock()
		e.stop = true
		e.stopGuard()
		e.mu.Unlock()
	})
}
