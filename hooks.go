package kpar

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// Hook observes a Consumer. A hook is any value implementing one or more of
// the HookX interfaces below; WithHooks rejects a value that implements
// none. Hooks are called synchronously from kpar's goroutines (workers, the
// poller, the committer, the rebalance callbacks), never under the engine's
// lock: they must be safe for concurrent use and fast, since a slow hook
// slows the goroutine that calls it.
type Hook any

// HookRecordDispatched is called when a worker is about to run the handler
// on a record; attempt counts from 1.
type HookRecordDispatched interface {
	OnRecordDispatched(r *kgo.Record, attempt int)
}

// HookRecordDone is called when a record was handled successfully, with the
// attempts it took and the time since its first dispatch.
type HookRecordDone interface {
	OnRecordDone(r *kgo.Record, attempts int, latency time.Duration)
}

// HookAttemptFailed is called when an attempt failed: the handler returned
// an error or panicked (err is then a *PanicError carrying the stack).
// retryIn is the backoff before the next attempt.
type HookAttemptFailed interface {
	OnAttemptFailed(r *kgo.Record, attempt int, err error, retryIn time.Duration)
}

// HookCommit is called after each commit with the offsets kpar asked to
// commit (topic -> partition -> next offset to consume) and the error, if
// the commit failed.
type HookCommit interface {
	OnCommit(offsets map[string]map[int32]int64, err error)
}

// HookCommitRequest is called after each OffsetCommit request a consumer
// group member sent (commits, retries of a commit with a smaller metadata,
// revokes, the final commit; RunMembers' commits too), with the partitions
// it carried, its encoded size in bytes (the finished-offsets metadata
// included) and its error: what commits cost the group's coordinator,
// which every member of a group writes to. A request cancelled while in
// flight (a commit under way when shutdown began, its error
// context.Canceled) is reported too, though it may not have reached the
// broker.
type HookCommitRequest interface {
	OnCommitRequest(partitions, bytes int, err error)
}

// HookPartitionPaused is called when a partition's fetching was paused:
// its window is full and two of its fetches' worth of records (at least
// WindowRecords, at most eight times that) wait outside it, or
// MaxBufferedBytes is used up and the partition holds more than its share
// of it, or fetched records of it wait for MaxBufferedBytes to admit them.
// buffered is the window's size at that moment.
type HookPartitionPaused interface {
	OnPartitionPaused(topic string, partition int32, buffered int)
}

// HookPartitionResumed is called when a paused partition's fetching
// resumed: at most half of what paused it still waits outside its window
// (one of its fetches' worth, within WindowRecords/2 and four times
// WindowRecords), it holds at most half its share of MaxBufferedBytes if
// that paused it, and none of its fetched records wait to be admitted.
// buffered is the window's size.
type HookPartitionResumed interface {
	OnPartitionResumed(topic string, partition int32, buffered int)
}

// HookPartitionsAssigned is called when the group assigns partitions.
type HookPartitionsAssigned interface {
	OnPartitionsAssigned(assigned map[string][]int32)
}

// HookPartitionsRevoked is called after revoked partitions were drained and
// committed (lost is false), or after lost partitions were dropped without a
// commit (lost is true).
type HookPartitionsRevoked interface {
	OnPartitionsRevoked(revoked map[string][]int32, lost bool)
}

// HookRecordStuck is called when a partition's window start has stayed on
// one unfinished record for StuckAfter: commits of that partition are held
// back by it. attempts counts the record's attempts so far (0 when it is
// still waiting for its first). Called once per record.
type HookRecordStuck interface {
	OnRecordStuck(topic string, partition int32, offset int64, attempts int, stuckFor time.Duration)
}

// HookDeadLettered is called after the dead-letter sink acknowledged a
// record; the record is finished from then on.
type HookDeadLettered interface {
	OnDeadLettered(l deadletter.Letter)
}

// HookDeadLetterFailed is called when writing records to a retry topic or
// to the dead-letter sink failed. The records stay unfinished (their
// window start holds) and the write is retried with backoff.
type HookDeadLetterFailed interface {
	OnDeadLetterFailed(records int, err error)
}

// HookTopicUnavailable is called with a non-nil err when fetches of a
// topic keep failing because the broker no longer has it (it was deleted,
// or deleted and created again): kpar then subscribes to the topic afresh.
// It is called with a nil err once records of the topic arrive again.
type HookTopicUnavailable interface {
	OnTopicUnavailable(topic string, err error)
}

func isHook(h Hook) bool {
	switch h.(type) {
	case HookRecordDispatched, HookRecordDone, HookAttemptFailed, HookCommit, HookCommitRequest,
		HookPartitionPaused, HookPartitionResumed, HookPartitionsAssigned, HookPartitionsRevoked,
		HookRecordStuck, HookDeadLettered, HookDeadLetterFailed, HookTopicUnavailable:
		return true
	}
	return false
}

// hooks holds each hook list pre-sorted by interface so that the hot path
// pays one length check when nobody listens.
type hooks struct {
	dispatched []HookRecordDispatched
	done       []HookRecordDone
	failed     []HookAttemptFailed
	commit     []HookCommit
	commitReq  []HookCommitRequest
	paused     []HookPartitionPaused
	resumed    []HookPartitionResumed
	assigned   []HookPartitionsAssigned
	revoked    []HookPartitionsRevoked

	stuck            []HookRecordStuck
	deadLettered     []HookDeadLettered
	deadLetterFailed []HookDeadLetterFailed
	topicUnavailable []HookTopicUnavailable
}

func newHooks(hs []Hook) hooks {
	var h hooks
	for _, x := range hs {
		if v, ok := x.(HookRecordDispatched); ok {
			h.dispatched = append(h.dispatched, v)
		}
		if v, ok := x.(HookRecordDone); ok {
			h.done = append(h.done, v)
		}
		if v, ok := x.(HookAttemptFailed); ok {
			h.failed = append(h.failed, v)
		}
		if v, ok := x.(HookCommit); ok {
			h.commit = append(h.commit, v)
		}
		if v, ok := x.(HookCommitRequest); ok {
			h.commitReq = append(h.commitReq, v)
		}
		if v, ok := x.(HookPartitionPaused); ok {
			h.paused = append(h.paused, v)
		}
		if v, ok := x.(HookPartitionResumed); ok {
			h.resumed = append(h.resumed, v)
		}
		if v, ok := x.(HookPartitionsAssigned); ok {
			h.assigned = append(h.assigned, v)
		}
		if v, ok := x.(HookPartitionsRevoked); ok {
			h.revoked = append(h.revoked, v)
		}
		if v, ok := x.(HookRecordStuck); ok {
			h.stuck = append(h.stuck, v)
		}
		if v, ok := x.(HookDeadLettered); ok {
			h.deadLettered = append(h.deadLettered, v)
		}
		if v, ok := x.(HookDeadLetterFailed); ok {
			h.deadLetterFailed = append(h.deadLetterFailed, v)
		}
		if v, ok := x.(HookTopicUnavailable); ok {
			h.topicUnavailable = append(h.topicUnavailable, v)
		}
	}
	return h
}
