package bench

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// work is a scenario's per-record handler body. Sleeping works report
// what they asked for and what they got to the tracker: this machine's
// sleeps overshoot (by about 0.6 ms), and ideals are computed from the
// sleeps as they really were.
type work func(tr *tracker, r *kgo.Record)

func noWork(*tracker, *kgo.Record) {}

func sleepWork(d time.Duration) work {
	return func(tr *tracker, _ *kgo.Record) { tr.sleep(d) }
}

// randomSleep sleeps a pseudo-random 0..maxMicros µs chosen by the record's
// partition and offset, so every contender (and every re-delivery) does
// the same work for the same record.
func randomSleep(maxMicros int64) work {
	return func(tr *tracker, r *kgo.Record) { tr.sleep(randomDelay(r.Partition, r.Offset, maxMicros)) }
}

func randomDelay(partition int32, offset, maxMicros int64) time.Duration {
	return time.Duration(mix(uint64(partition)<<48^uint64(offset))%uint64(maxMicros+1)) * time.Microsecond
}

// mix is splitmix64's finaliser.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// burnWork spins the CPU for iters rounds of xorshift.
func burnWork(iters int) work {
	return func(_ *tracker, r *kgo.Record) {
		if burn(uint64(r.Offset)|1, iters) == 0 {
			panic("bench: xorshift reached 0") // never: keeps the loop alive
		}
	}
}

func burn(x uint64, iters int) uint64 {
	for range iters {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

// calibrateBurn returns the iterations of burn that take d of CPU, from the
// fastest of several trials (the least disturbed by other load).
func calibrateBurn(d time.Duration) int {
	const trial = 200_000
	best := time.Duration(1 << 62)
	for range 7 {
		start := time.Now()
		if burn(3, trial) == 0 {
			panic("bench: xorshift reached 0")
		}
		best = min(best, time.Since(start))
	}
	return max(1, int(float64(trial)*float64(d)/float64(best)))
}
