package kpar

import (
	"time"

	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/internal/buffer"
	"github.com/kpar/kpar/internal/offsetmeta"
	"github.com/kpar/kpar/internal/sched"
	"github.com/kpar/kpar/internal/window"
	"github.com/twmb/franz-go/pkg/kgo"
)

// epoch is the origin of the dispatch times in item: one for the process,
// so that every engine (the consumer's, backfill's, share's) has it.
var epoch = time.Now()

// item is a scheduled record with its bookkeeping.
type item struct {
	rec  *kgo.Record
	part *partState
	seq  window.Seq
	size int64
	// lane is the hash of the key (never 0 or 1) in key mode, or with a
	// KeyRateLimit; 0 for a record without a key. Computed by prepare,
	// outside the lock, or, where key mode may use wide lanes, left
	// unhashed until the record needs its key's lane (laneOf).
	lane     uint64
	attempts int
	// Dispatch times as durations since epoch (monotonic), half
	// the size of two time.Times in the struct every record has.
	first   time.Duration // first dispatch, for latency
	started time.Duration // this attempt's dispatch, for the adaptive limit

	x *extra // failure and retry-topic state; nil for most records
	// run holds the records of a record run (run.go); rec is then the
	// first of them. nil for a single record.
	run *recRun
}

// extra is the state of the few records that failed or came from a retry
// topic, kept out of item so the common record stays small.
type extra struct {
	// Failure history, set under mu by fail.
	firstFailure time.Time
	lastFailure  time.Time
	lastErr      error
	class        deadletter.Class
	// keyPaid: the record reserved its key's token (KeyRateLimit) and was
	// set aside until it is due; take lets it through once.
	keyPaid bool
	// outputs are what the record's successful attempt emitted, kept for
	// the transaction that commits the record (ExactlyOnce).
	outputs []*kgo.Record
	// outKind is what outputs are, and outLetter the record's letter when
	// they are its retry record or dead letter (txn.go's refit needs them).
	outKind   outputKind
	outLetter *deadletter.Letter
	// retryRefused: its next retry topic refused it as too large, so it
	// goes to the dead letters instead (writeExiled). Set under mu.
	retryRefused bool
	// hang is its timed-out streak, hung set once the hang policy sent it
	// to the dead letters (hang.go). Set under mu.
	hang hangState
	hung bool

	// Records consumed from a retry topic: the level n of <topic>.retry.<n>,
	// when they are due, the attempts before this level, and the original
	// record the handler sees.
	level         int
	due           time.Time
	priorAttempts int
	origin        *kgo.Record
}

// ext returns it's extra state, allocating it on first use.
func (it *item) ext() *extra {
	if it.x == nil {
		it.x = new(extra)
	}
	return it.x
}

// level is the retry topic level the record came from, 0 for the original
// topic.
func (it *item) level() int {
	if it.x == nil {
		return 0
	}
	return it.x.level
}

// original is the record as the handler sees it: for a record from a retry
// topic, the original topic, partition, offset and headers.
func (it *item) original() *kgo.Record {
	if it.x != nil && it.x.origin != nil {
		return it.x.origin
	}
	return it.rec
}

func (it *item) totalAttempts() int {
	if it.x == nil {
		return it.attempts
	}
	return it.x.priorAttempts + it.attempts
}

type task = sched.Task[item]

// initTask makes t the task of a record entering its window. It clears t
// in place and then sets the fields rather than assigning a composite
// literal: the compiler builds a literal of this size on the stack and
// copies it with 16-byte loads, each spanning two of the 8-byte stores
// that built it, which the CPU cannot forward from its store buffer and
// waits for. In a CPU profile of kpar bench noop that copy was the
// costliest line of the engine, 15 ns per record; in place it is 3.
func initTask(t *task, ps *partState, rec *kgo.Record, seq window.Seq, size int64, lane uint64) {
	*t = task{}
	it := &t.Value
	it.rec, it.part, it.seq, it.size, it.lane = rec, ps, seq, size, lane
}

// tp names a partition's state: a topic partition, and for a range read
// (Backfill), where several readers share a partition, the slice of it.
type tp struct {
	topic     string
	partition int32
	slice     int32 // Backfill's slice index; 0 for the other sources
}

type partStatus uint8

const (
	live        partStatus = iota // records are dispatched
	withdrawing                   // a share group member stops: records not started are released (withdraw.go)
	revoking                      // being revoked: finishing in-flight records, dispatching nothing new
	dropped                       // state released; late completions are ignored
)

// partState is one assigned partition. Every field is guarded by engine.mu.
type partState struct {
	tp
	status  partStatus
	level   int // n when this is retry topic n, else 0
	win     *window.Window
	lanes   sched.Lanes[item]
	running int // records handed to workers and not finished yet
	// buf is the partition's part of the byte budget, and its reasons to
	// pause fetching: a window's worth of records is held, or
	// MaxBufferedBytes is used up and this partition holds more than its
	// share of it (internal/buffer). syncPause applies a change.
	buf buffer.Part
	// held are fetched records that did not fit in the window, in offset
	// order, waiting for room. Once heldCap records are held the partition
	// is paused until half of that drained, so held records never exceed
	// heldCap plus one fetch of the partition. Their bookkeeping is
	// prepared (see prepare); they get their tasks as they enter the
	// window, when room frees.
	held heldQueue
	// over are fetched records, after held ones, that MaxBufferedBytes
	// had no room for: not admitted, not counted in buf, handed to
	// nobody. The partition is paused until they all are admitted, as
	// bytes free (admitOver), so they are at most the fetches of it that
	// came before the pause took effect.
	over heldQueue
	// wide: keyed records enter the wide lane of lanes (widelane.go);
	// wideHold counts the records to admit to key lanes before it may
	// open again.
	wide     bool
	wideHold int
	// tasks holds the tasks of the records in win (taskstore.go).
	tasks taskStore
	// fetched is the number of records the partition's latest fetch
	// brought, the unit of heldCap.
	fetched   int
	committed int64         // last committed offset, -1 for none
	idle      chan struct{} // closed when running drops to 0 while revoking

	// Finished-offsets bookkeeping for the committer (commit.go).
	progress      uint64 // bumped whenever a record of the window finishes
	committedProg uint64 // progress as of the last successful commit
	committedMeta int    // finished offsets above committed the last commit's metadata covered
	metaCut       bool   // the last commit's metadata left finished offsets out
	metaLimit     int    // metadata bytes allowed; lowered when a broker refuses the size
	// committedAt and committedText are the offset and metadata of the
	// last commit known to have landed (its own, or the one read at
	// assignment: -1 for none), which ExactlyOnce's lost work must find
	// again (lostwork.go). Unlike resumeAt, kept after the first fetch.
	committedAt   int64
	committedText string
	// skip holds the finished offsets read from the commit metadata at
	// assignment: records fetched at these offsets are finished without
	// running (push). Sorted; consumed from the front as records arrive.
	skip    []offsetmeta.Run
	skipped int // records finished from skip in this assignment
	// kept is what this member finished before it lost the partition and
	// kept with its outputs (ExactlyOnce, lostwork.go); nil for nothing.
	kept *regained
	// resumeAt is the committed offset read at assignment (-1 for none
	// or unread); the first fetched record is checked against it once, to
	// report an offset reset.
	resumeAt int64
	// firstAdmitted is the offset of the first record this assignment
	// admitted (-1 before any): every offset from it to the window start
	// is finished, which is what a lost partition keeps (lostwork.go)
	// when no commit of this assignment landed.
	firstAdmitted int64

	// Stuck detection, sampled by the watchdog.
	stuckOffset   int64
	stuckSince    time.Time
	stuckReported bool
}

// heldCap is how many held records pause the partition: two of its fetches,
// at least one window and at most eight. A resume takes effect only with
// the client's next fetch, which brings the partition's records a fetch
// round trip later (building and decoding a whole fetch of every
// partition): the half left when the resume is sent, one fetch of the
// partition, keeps its workers busy until then. MaxBufferedBytes bounds
// the bytes of all of it.
func (ps *partState) heldCap(window int) int { return max(window, min(2*ps.fetched, 8*window)) }

// finishedBefore reports whether offset is in the finished set read from
// the commit metadata at assignment. Offsets arrive in increasing order, so
// runs below offset are dropped as it goes.
func (ps *partState) finishedBefore(offset int64) bool {
	for len(ps.skip) > 0 && ps.skip[0].To <= offset {
		ps.skip = ps.skip[1:]
	}
	if len(ps.skip) == 0 {
		ps.skip = nil
		return false
	}
	return ps.skip[0].From <= offset
}
