package kpar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestOverloadSpellEndsWhenTheBacklogDrains: one record answered
// Overloaded once among records that succeed (kpar forward --batch: one
// 503 item in a batch of 2xx), retried soon after and succeeding, while
// the topic drains within a second, closes the "overloaded" line with
// "recovered" once the quiet has lasted overloadEnds, although no success
// comes after that. Before, a spell ended only at a success overloadEnds
// after its failure, so it stayed open, silent, until the next record.
func TestOverloadSpellEndsWhenTheBacklogDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		c, dial := virtualCluster(t, "drain", 1)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprint("k", i)
		}
		produceKeys(t, c, dial, "drain", keys)
		l := newStartLog()
		var failed atomic.Bool
		h := HandlerFunc(func(ctx context.Context, r *kgo.Record) error {
			if string(r.Key) == "k5" && failed.CompareAndSwap(false, true) {
				return Overloaded(errors.New("503 Service Unavailable (batch item 5)"))
			}
			l.success(r)
			return nil
		})
		logs := &countLevels{n: map[slog.Level]int{}, msgs: map[string]int{}}
		_, stop := runVirtual(t, c, dial, "drain", h, WithLogger(slog.New(logs)))
		waitHandled(t, l, n, time.Minute)
		time.Sleep(2 * overloadEnds) // virtual: the quiet after the last failure
		synctest.Wait()
		logs.mu.Lock()
		over := logs.msgs["kpar: downstream overloaded: an attempt failed with an error marked Overloaded; "+
			"such attempts burn no retry, dispatching slows down to probes, and further ones are summarised every 10s"]
		rec := logs.msgs["kpar: downstream recovered: attempts succeed again"]
		logs.mu.Unlock()
		if over != 1 || rec != 1 {
			t.Errorf("overloaded logged %d times and recovered %d times, %v after the last failure; want 1 and 1", over, rec, 2*overloadEnds)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	})
}
