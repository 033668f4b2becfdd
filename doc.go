// Package kpar consumes Kafka topics with many records in flight per
// partition, without ever committing past an unfinished record.
//
// # The model
//
// A Consumer is one member of a consumer group. A single poller goroutine
// fetches records with franz-go and appends them to the sliding window of
// their partition. A scheduler hands ready records to a fixed pool of
// Concurrency workers that run the Handler. The committer periodically
// commits, for each partition, the window's start: the lowest offset that is
// not finished yet. Everything below it is done, so a crash or a rebalance
// can only cause the records from the start onwards to be delivered again —
// at-least-once with duplicates bounded by the window — and never skips a
// record. The naive alternative, committing the highest finished offset,
// loses the slow record that a faster one overtook.
//
// A window is bounded (WindowRecords per partition, MaxBufferedBytes over
// all partitions). Records fetched beyond a full window wait outside it, up
// to two of the partition's fetches (at least one window, at most eight);
// then the partition is paused at the client and resumed once half of
// those moved in, so a slow handler slows fetching down instead of growing
// memory, and a fast one never waits for a fetch.
//
// # Ordering
//
// Ordering(ByKey), the default, runs one record per key and partition at a
// time, in offset order, and different keys in parallel; records with a nil
// key are unordered. ByPartition runs one record per partition at a time.
// Unordered runs anything. Ordering never blocks the worker pool: records of a busy key
// wait in that key's queue while workers take other keys. (While the handler
// is cheap, ByKey and Unordered run a partition's records one after another,
// and a worker takes up to 64 of them at a time, which costs less; a record
// that fails or runs long ends that at once: see ByKey.)
//
// # Failures
//
// A handler error or panic fails the attempt; the record is retried after a
// jittered exponential backoff (RetryBackoff) without holding a worker. In
// ByKey and ByPartition modes the records behind it in its key or partition wait
// for it, as ordering requires. Its window start waits too: a failing record
// is never committed past. After MaxAttempts a record goes to the retry
// topics (RetryTopics), then to the dead-letter sink (DeadLetters; the
// deadletter package has Kafka and file sinks, the pgsink module a
// PostgreSQL one).
//
// # Flow control
//
// A downstream can say it is overloaded: an error wrapped with Overloaded
// (kpar's forward package marks 429, 503 and unanswered requests so) does
// not count against MaxAttempts, and dispatching slows down until the
// downstream takes records again: through AdaptiveConcurrency's in-flight
// limit, or without it a circuit breaker that probes an outage with growing
// pauses. RateLimit and KeyRateLimit cap attempt starts per second, in all
// and per record key. Records waiting for any of these stay in their window
// and burn no attempt, and fetching pauses as the windows fill.
//
// # Share groups and range reads
//
// Two more sources feed the same handler, retries and dead-letter sinks.
// With ShareGroup a Consumer is a member of a Kafka share group (KIP-932):
// the broker hands every partition's records to every member and tracks
// each record, and kpar acknowledges each outcome (ACCEPT once handled or
// once the sink took its dead letter; retries stay local, with the lock
// renewed; RELEASE at shutdown for what did not start). There are no
// windows or commits then, and no order across members. Backfill reads a
// fixed offset or time range with several assigned readers per partition,
// no group, keeping its progress per slice.
//
// # Options
//
// Options are checked at compile time where they apply: New and NewBatch
// take a ConsumerOpt, Backfill a BackfillOpt, RunMembers a MemberOpt; an Opt
// goes anywhere, a FlowOpt (the pipeline's rules: concurrency, limits,
// retries, dead letters) to New and Backfill, a GroupOpt (membership) to New
// and RunMembers. Every default is written on its option and set in one
// place; New validates all options together, names the offending one, and
// refuses a combination it cannot honour rather than ignoring an option.
//
// # Rebalances and shutdown
//
// On revoke, kpar stops dispatching the revoked partitions, waits up to
// RevokeTimeout for their running records, commits their window starts and
// drops them; lost partitions are dropped without a commit. When Run's
// context is cancelled (or Close is called) kpar stops fetching, finishes the
// buffered records for up to ShutdownTimeout, commits and leaves the group.
package kpar
