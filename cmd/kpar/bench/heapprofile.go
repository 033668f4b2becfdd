package bench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// heapProfileEnv names the environment variable that makes each memory
// child write a heap profile, near its peak heap, to
// $KPAR_BENCH_HEAPPROFILE-<contender>.pprof (for go tool pprof -sample_index
// inuse_space). It is an environment variable rather than a flag because
// the child is the same binary re-executed, and inherits the environment.
const heapProfileEnv = "KPAR_BENCH_HEAPPROFILE"

// heapProfiler writes the heap profile each time the sampled heap passes
// the last profiled peak by 5 %: the file left is the one nearest the
// peak. A heap profile's inuse figures are those of the last collection,
// so a profile near the peak shows what was live when the heap was
// largest.
type heapProfiler struct {
	path string
	last int64
	err  error
}

func newHeapProfiler(contender string) *heapProfiler {
	prefix := os.Getenv(heapProfileEnv)
	if prefix == "" {
		return nil
	}
	return &heapProfiler{path: fmt.Sprintf("%s-%s.pprof", prefix, contender)}
}

// observe is called by the sampler's goroutine with each sample.
func (p *heapProfiler) observe(heap int64) {
	if p == nil || heap <= p.last+p.last/20 {
		return
	}
	p.last = heap
	f, err := os.Create(p.path)
	if err != nil {
		p.err = err
		return
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		p.err = err
	}
}

func init() {
	if os.Getenv(heapProfileEnv) != "" {
		runtime.MemProfileRate = 64 << 10
	}
}
