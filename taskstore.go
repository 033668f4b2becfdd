package kpar

import "github.com/kpar/kpar/internal/window"

// chunkTasks is how many tasks of consecutive window seqs share one chunk:
// 5.5 KiB, so that a partition with a few records in its window holds little.
const chunkTasks = 64

type taskChunk [chunkTasks]task

// taskStore holds the tasks of one partition's window, in chunks of
// consecutive seqs that go back to the engine's taskPool once the window
// start has passed them. A record's task thus costs no allocation once the
// engine runs, and the GC scans a window's worth of tasks instead of every
// fetch's: in kpar bench noop the fetch-sized task slabs this replaces were
// an eighth of the process's allocations (held records cost a pointer-free
// recMeta, a quarter of a task).
//
// A task is reused only after its record finished and the window start
// moved past it. Nothing points at it then: its lane released it, and no
// queue, timer, worker or exile batch holds a finished record (a shared
// attempt context may still name it, for reports only, which check the
// record they find). The chunks of a dropped partition are never recycled:
// its records may still sit in the ready queue or run.
//
// Guarded by engine.mu, like the partState that holds it.
type taskStore struct {
	chunks []*taskChunk // chunks[i] holds the seqs from base+i*chunkTasks
	base   window.Seq
}

// at returns the task of seq, an unfinished seq of the window: one just
// pushed, or one of a record run (run.go) that gets a task of its own. A
// run's records have no tasks until then, so the store may hold none of
// the chunks below seq, or none at all.
func (s *taskStore) at(seq window.Seq, pool *taskPool) *task {
	if len(s.chunks) == 0 {
		s.base = seq &^ (chunkTasks - 1)
	} else if seq < s.base {
		// Below every chunk held: add the chunks down to seq's.
		k := int((s.base - seq&^(chunkTasks-1)) / chunkTasks)
		below := make([]*taskChunk, k, k+len(s.chunks))
		for i := range below {
			below[i] = pool.get()
		}
		s.chunks = append(below, s.chunks...)
		s.base -= window.Seq(k * chunkTasks)
	}
	i := int((seq - s.base) / chunkTasks)
	for i >= len(s.chunks) {
		s.chunks = append(s.chunks, pool.get())
	}
	return &s.chunks[i][seq%chunkTasks]
}

// retire returns to pool the chunks of the seqs below head, the window's
// first unfinished seq; every chunk when the window is empty. Callers
// retire only after their last use of the finished task.
func (s *taskStore) retire(win *window.Window, pool *taskPool) {
	n := len(s.chunks)
	if win.Len() > 0 {
		if win.Head() < s.base {
			return // the first chunk holds the task of a record above a run
		}
		n = min(n, int((win.Head()-s.base)/chunkTasks))
	}
	if n == 0 {
		return
	}
	for i := range n {
		pool.put(s.chunks[i])
	}
	s.base += window.Seq(n * chunkTasks)
	rest := copy(s.chunks, s.chunks[n:])
	clear(s.chunks[rest:])
	s.chunks = s.chunks[:rest]
}

// taskPoolMax bounds the free chunks the engine keeps: enough for the
// windows' turnover between two refills, not for every window at once.
const taskPoolMax = 64

// taskPool is the engine's free task chunks. Guarded by engine.mu.
type taskPool struct{ free []*taskChunk }

func (p *taskPool) get() *taskChunk {
	n := len(p.free)
	if n == 0 {
		return new(taskChunk)
	}
	c := p.free[n-1]
	p.free[n-1] = nil
	p.free = p.free[:n-1]
	return c
}

// put keeps c for reuse, cleared: a finished task still points at its
// record, and one record pins its whole fetch (franz-go's record slab of
// its batch, and the response body its key and value alias). Uncleared,
// the pool's 4,096 stale pointers kept older fetches live: kpar bench
// memory's heap profiles showed two fetch bodies live where raw franz-go
// holds one.
func (p *taskPool) put(c *taskChunk) {
	if len(p.free) < taskPoolMax {
		clear(c[:])
		p.free = append(p.free, c)
	}
}
