package kpar

import (
	"math/rand/v2"
	"testing"

	"github.com/kpar/kpar/internal/window"
)

// TestTaskStoreNeverReusesAnUnfinishedTask drives a window and its task
// store the way the engine does, finishing records out of order, and checks
// that the task of every record still in the window is its own: no chunk is
// recycled while one of its seqs is unfinished, and recycled chunks come
// back.
func TestTaskStoreNeverReusesAnUnfinishedTask(t *testing.T) {
	const windowRecords = 300
	rng := rand.New(rand.NewPCG(1, 2))
	win := window.New(windowRecords)
	var (
		store    taskStore
		pool     taskPool
		inWindow = map[window.Seq]*task{}
		offset   int64
		chunks   = map[*taskChunk]bool{} // every chunk the store ever held
	)
	for step := range 20_000 {
		// Push while there is room, as admit and complete do.
		for win.Len() < windowRecords && rng.IntN(3) > 0 {
			seq := win.Push(offset)
			tk := store.at(seq, &pool)
			*tk = task{Value: item{seq: seq}}
			inWindow[seq] = tk
			offset++
		}
		if len(inWindow) == 0 {
			continue
		}
		// Finish one record at random, then retire as complete does.
		var pick window.Seq
		n := rng.IntN(len(inWindow))
		for s := range inWindow {
			if n == 0 {
				pick = s
				break
			}
			n--
		}
		win.Done(pick)
		delete(inWindow, pick)
		store.retire(win, &pool)
		for s, tk := range inWindow {
			if tk.Value.seq != s || tk != store.at(s, &pool) {
				t.Fatalf("step %d: the task of seq %d was reused (it holds seq %d)", step, s, tk.Value.seq)
			}
		}
		for _, c := range store.chunks {
			chunks[c] = true
		}
	}
	// A window spans at most windowRecords/chunkTasks+2 chunks; with
	// recycling, the store never needs many more than that.
	if got := len(chunks); got > windowRecords/chunkTasks+4 {
		t.Errorf("%d chunks allocated for a window of %d records: chunks are not reused", got, windowRecords)
	}
	// An empty window gives every chunk back.
	for s := range inWindow {
		win.Done(s)
	}
	store.retire(win, &pool)
	if len(store.chunks) != 0 {
		t.Errorf("an empty window still holds %d chunks", len(store.chunks))
	}
}
