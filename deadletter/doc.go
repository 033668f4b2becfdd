// Package deadletter stores the records kpar gave up on, reads them back,
// and replays them.
//
// # The model
//
// A Letter is the original record, kept byte-for-byte (topic,
// partition, offset, key, value, headers, timestamp), plus why it failed
// (Class, the last error's Message, the number of Attempts) and when
// (FirstFailure, LastFailure). Its identity is the original's
// "topic/partition/offset" (Letter.ID), and the consumer Group that gave
// up on it: several groups may dead-letter the same record, and each of
// their letters is kept.
//
// A Sink stores dead letters durably: Write returns nil only once every
// letter of the batch is durable, and on error the caller (kpar's engine)
// keeps the records unfinished and retries the whole batch later. That
// makes duplicates possible wherever the medium cannot refuse them, so:
//
//   - pgsink.Sink (module github.com/kpar/kpar/deadletter/pgsink) is
//     idempotent: one row per (group, topic, partition, offset),
//     INSERT ... ON CONFLICT DO NOTHING.
//   - KafkaSink and FileSink may store a letter twice (a batch retried after
//     a partial failure, or a crash after the write but before the commit);
//     every Source drops the later copies, keeping the first.
//
// # Sinks
//
// NewKafkaSink writes to "<topic>.dlq" by default, one record per letter:
// the original key, value and headers, then the dead-letter headers. The
// default header dialect (Kpar) follows Kafka's own dead-letter convention
// (KIP-1191's __dlq.errors.*, UTF-8 strings) plus kpar.* headers for what
// that convention lacks; the Spring dialect writes Spring Kafka's
// kafka_dlt-* headers so a Spring service can consume kpar's dead letters.
// A letter too large for its topic is written with its value (then its key
// and headers) left out and headers saying so, rather than retried for
// ever: see KafkaSink.
// NewFileSink appends JSON Lines and fsyncs. The PostgreSQL sink lives in
// its own module, github.com/kpar/kpar/deadletter/pgsink, so that programs
// without it link no database driver.
//
// # Reading
//
// OpenSource opens kafka:// and file:// URLs (pgsink.OpenSource opens
// postgres:// ones). FromRecord
// decodes a record of a dead-letter topic written by kpar, Spring Kafka,
// Kafka Connect or Kafka Streams, restoring the original's location and
// headers; the exported Header*, Spring*, Connect* and Streams* constants
// are the names it knows.
//
// # Replay
//
// Replay sends dead letters back to Kafka, each marked with
// HeaderReplayedFrom (its ID) and HeaderReplayRun (the run id). It is
// idempotent per run id: a journal file records each batch as pending
// before it is produced and as sent once acknowledged; a re-run skips what
// was sent and, for a batch an interrupted run left pending, first looks in
// the target partitions (from the end offsets journaled before sending) for
// records carrying this run's marker, and sends only those not found. A
// dead letter is thus sent once per run id across crashes, as long as the
// journal survives. `kpar dlq replay` is this function with a run id
// derived from its flags.
package deadletter
