package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar/cmd/kpar/internal/embedded"
)

// Transactions open when a `kpar broker --data-dir` died (kill -9, a crash).
//
// kfake saves its in-progress transactions only on a clean Close
// (session_state.json, which it deletes once it loaded it). When it loads a
// directory without them, it replays each partition's segment files and
// treats a transaction with records but no marker as aborted: it notes the
// aborted range in memory and bumps the producer's epoch, but writes no
// ABORT marker (kfake persist.go, loadPartitionFullReplay, "Implicitly
// abort in-flight transactions"). A read_committed reader is told the
// range's first offset in each fetch (AbortedTransactions) and, as Kafka's
// clients do, skips that producer's transactional batches from there until
// it reads the producer's ABORT marker. None comes: the reader also skips
// every later transaction of the same producer in that fetch, committed or
// not. Measured in the fault matrix: 347 and 398 committed replies that a
// read_committed reader never returned, after one SIGKILL.
//
// So before serving a directory whose transactions kfake cannot restore,
// kpar broker finds the transactions left open in its segment files and
// writes their ABORT markers, through kfake's own WriteTxnMarkers on a
// broker of its own on a free port that no client knows, then closes that
// broker cleanly (kfake saves the bumped epochs, which fence the dead
// transactions' producers) and starts the real one.
//
// A death in the middle of a commit is worse: kfake writes the COMMIT
// markers, then the transaction's offset commits (embedded's
// txnjournal.go), so the transaction's records are read while its inputs'
// offsets are not committed, and are handled again: outputs twice. A
// transaction whose markers were all written is completed from the journal
// the broker keeps; one cut between two of its markers is not (see
// repairTransactions).

// kfakeSessionState is the file kfake writes on a clean Close with the
// transactions then in progress, and removes once it loaded them.
const kfakeSessionState = "session_state.json"

// openTxn is a transaction with records in a partition and no marker.
type openTxn struct {
	topic     string
	partition int32
	producer  int64
	epoch     int16
	first     int64 // offset of its first record in the partition
}

// repairTransactions ends the transactions that the broker which last used
// dir left unfinished when it died, and reports them on stderr, a line
// each: a transaction left open gets its ABORT markers; one whose COMMIT
// markers were all written but not its offset commits gets those, from the
// journal (embedded's txnjournal.go). One cut in the middle of its markers
// stays half committed: kfake took its unmarked partitions for aborted as
// it loaded them, so they get their ABORT markers, and its offsets stay
// uncommitted (committing them would lose the aborted records' outputs).
// It does nothing after a clean stop: kfake then restores the open
// transactions, which their producers may still commit, and ends none
// half.
func repairTransactions(ctx context.Context, cfg embedded.Config, stderr io.Writer) error {
	dir := cfg.DataDir
	if _, err := os.Stat(filepath.Join(dir, kfakeSessionState)); err == nil {
		return nil // a clean stop with something to restore
	}
	open, committed, err := findOpenTransactions(dir)
	if err != nil {
		return err
	}
	journal, err := embedded.ReadTxnJournal(dir)
	if err != nil {
		return fmt.Errorf("reading the transactions' offset journal %s in --data-dir %s: %w", embedded.TxnJournalFile, dir, err)
	}
	// A committed transaction still open somewhere was cut in the middle
	// of its markers: it stays half committed (see halfMarked).
	halfMarked := map[producerEpoch]bool{}
	for _, o := range open {
		if k := (producerEpoch{o.producer, o.epoch}); committed[k] {
			halfMarked[k] = true
		}
	}
	var cut []embedded.JournaledTxn // committed whole: their offsets may be missing
	for _, t := range journal {
		if k := (producerEpoch{t.ProducerID, t.Epoch}); committed[k] && !halfMarked[k] {
			cut = append(cut, t)
		}
	}
	if len(open) == 0 && len(cut) == 0 {
		return nil
	}
	cfg.Addr = "127.0.0.1:0"
	c, err := embedded.Start(cfg)
	if err != nil {
		return err
	}
	err = writeAbortMarkers(ctx, c.Addr(), open)
	var completed []string
	if err == nil {
		completed, err = completeOffsets(ctx, c.Addr(), cut)
	}
	c.Close() // saves what the markers and commits changed, and the bumped epochs
	if err != nil {
		return fmt.Errorf("ending the transactions left unfinished in --data-dir %s: %w; without it read_committed readers would skip those producers' later transactions, or see a committed transaction's records without its offsets: start again, or use another --data-dir", dir, err)
	}
	var aborted, half []string
	abortedBy := map[int64]bool{}
	for _, o := range open {
		where := fmt.Sprintf("%s/%d", o.topic, o.partition)
		if halfMarked[producerEpoch{o.producer, o.epoch}] {
			half = append(half, where)
		} else {
			aborted, abortedBy[o.producer] = append(aborted, where), true
		}
	}
	if len(aborted) > 0 {
		fmt.Fprintf(stderr, "kpar broker: the broker that used --data-dir %s did not stop cleanly (kill -9 or a crash): aborted the %d transaction(s) it left open (in %s); read_committed readers skip their records, their producers are fenced and retry in a new transaction\n",
			dir, len(abortedBy), strings.Join(sortedSet(aborted), ", "))
	}
	if len(completed) > 0 {
		fmt.Fprintf(stderr, "kpar broker: the broker that used --data-dir %s died in the middle of committing transactions (kill -9 or a crash): completed their commits (their offset commits of %s), so that their inputs are not handled again\n",
			dir, strings.Join(sortedSet(completed), ", "))
	}
	if len(half) > 0 {
		fmt.Fprintf(stderr, "kpar broker: the broker that used --data-dir %s died while it wrote a transaction's COMMIT markers (kill -9 or a crash): aborted it where no marker was written (%s), and left its offsets uncommitted; its consumers handle its inputs again, and a read_committed reader of the partitions it committed in sees their outputs twice (a limit of the development broker: Kafka completes such a commit)\n",
			dir, strings.Join(sortedSet(half), ", "))
	}
	return nil
}

// producerEpoch names a transaction: with KIP-890 a producer's epoch moves
// on at each of its transactions' ends, and kfake's markers carry the
// transaction's epoch.
type producerEpoch struct {
	producer int64
	epoch    int16
}

// sortedSet is s sorted, without repeats.
func sortedSet(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// completeOffsets commits, on the broker at addr, the journaled offsets of
// committed transactions that the group does not have: those older than
// its commit, or at the same offset with other metadata. A group moved on
// past them (a later commit) keeps its own. It returns the group/topic/
// partition it committed.
func completeOffsets(ctx context.Context, addr string, txns []embedded.JournaledTxn) ([]string, error) {
	if len(txns) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var done []string
	for _, t := range txns {
		current, err := adm.FetchOffsets(ctx, t.Group)
		if errors.Is(err, kerr.GroupIDNotFound) {
			err = nil // its first commit was the one cut off
		}
		if err != nil {
			return done, fmt.Errorf("reading the offsets of group %s: %w", t.Group, err)
		}
		var missing kadm.Offsets
		for _, o := range t.Offsets {
			meta := ""
			if o.Metadata != nil {
				meta = *o.Metadata
			}
			if c, ok := current.Lookup(o.Topic, o.Partition); ok && c.Err == nil && (c.At > o.Offset || c.At == o.Offset && c.Metadata == meta) {
				continue
			}
			missing.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset, LeaderEpoch: o.LeaderEpoch, Metadata: meta})
			done = append(done, fmt.Sprintf("%s/%d for group %s", o.Topic, o.Partition, t.Group))
		}
		if len(missing) == 0 {
			continue
		}
		resps, err := adm.CommitOffsets(ctx, t.Group, missing)
		if err == nil {
			err = resps.Error()
		}
		if err != nil {
			return done, fmt.Errorf("committing the offsets of transactional ID %s's last transaction to group %s: %w", t.TransactionalID, t.Group, err)
		}
	}
	return done, nil
}

// findOpenTransactions reads the segment files of every partition in dir
// (kfake's layout: partitions/<escaped topic>-<n>/<base offset>.dat, each
// a run of Kafka record batches) and returns, per partition and producer,
// a transaction whose last transactional batch is data, not a marker.
func findOpenTransactions(dir string) ([]openTxn, map[producerEpoch]bool, error) {
	committed := map[producerEpoch]bool{}
	parts, err := os.ReadDir(filepath.Join(dir, "partitions"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, committed, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var open []openTxn
	for _, p := range parts {
		i := strings.LastIndexByte(p.Name(), '-')
		if !p.IsDir() || i < 0 {
			continue
		}
		topic, err1 := url.PathUnescape(p.Name()[:i])
		partition, err2 := strconv.ParseInt(p.Name()[i+1:], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		found, err := openInPartition(filepath.Join(dir, "partitions", p.Name()), committed)
		if err != nil {
			return nil, nil, err
		}
		for _, o := range found {
			o.topic, o.partition = topic, int32(partition)
			open = append(open, o)
		}
	}
	return open, committed, nil
}

// Record batch attributes (Kafka's RecordBatch format).
const (
	batchTransactional = 0x10
	batchControl       = 0x20
)

// openInPartition scans the segment files of one partition directory, in
// offset order, and returns the transactions still open at the end. It
// notes in committed the transactions it finds a COMMIT marker of.
func openInPartition(pdir string, committed map[producerEpoch]bool) ([]openTxn, error) {
	files, err := filepath.Glob(filepath.Join(pdir, "*.dat"))
	if err != nil {
		return nil, err
	}
	base := func(f string) int64 {
		n, _ := strconv.ParseInt(strings.TrimSuffix(filepath.Base(f), ".dat"), 10, 64)
		return n
	}
	slices.SortFunc(files, func(a, b string) int { return cmp.Compare(base(a), base(b)) })
	open := map[int64]openTxn{} // producer ID -> its open transaction
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		eachBatch(raw, func(b kmsg.RecordBatch) bool {
			switch {
			case b.Attributes&batchTransactional == 0:
			case b.Attributes&batchControl != 0:
				delete(open, b.ProducerID)
				if isCommitMarker(b) {
					committed[producerEpoch{b.ProducerID, b.ProducerEpoch}] = true
				}
			default:
				if _, ok := open[b.ProducerID]; !ok {
					open[b.ProducerID] = openTxn{producer: b.ProducerID, epoch: b.ProducerEpoch, first: b.FirstOffset}
				}
			}
			return true
		})
	}
	var out []openTxn
	for _, o := range open {
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b openTxn) int { return cmp.Compare(a.first, b.first) })
	return out, nil
}

// writeAbortMarkers sends one WriteTxnMarkers request, an ABORT marker for
// each transaction of open, to the broker at addr. kfake took them for
// aborted when it loaded the directory (records and no marker): a COMMIT
// marker now would not make their records readable.
func writeAbortMarkers(ctx context.Context, addr string, open []openTxn) error {
	if len(open) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrWriteTxnMarkersRequest()
	for _, o := range open {
		m := kmsg.NewWriteTxnMarkersRequestMarker()
		m.ProducerID, m.ProducerEpoch, m.Committed = o.producer, o.epoch, false
		t := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
		t.Topic, t.Partitions = o.topic, []int32{o.partition}
		m.Topics = append(m.Topics, t)
		req.Markers = append(req.Markers, m)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, m := range resp.Markers {
		for _, t := range m.Topics {
			for _, p := range t.Partitions {
				// A partition kfake no longer has (its topic deleted,
				// its files left behind) has no reader to mislead.
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
					return fmt.Errorf("%s/%d, producer %d: %w", t.Topic, p.Partition, m.ProducerID, err)
				}
			}
		}
	}
	return nil
}

// eachBatch calls fn with each record batch of raw, a run of Kafka record
// batches as kfake's segment files and a fetch's records hold them (each a
// base offset of 8 bytes, a length of 4, then that many bytes), until fn
// returns false. kfake ignores a torn batch at the end; so does eachBatch,
// and it stops at one it cannot read.
func eachBatch(raw []byte, fn func(kmsg.RecordBatch) bool) {
	for len(raw) >= 12 {
		n := int(binary.BigEndian.Uint32(raw[8:12]))
		if n < 0 || 12+n > len(raw) {
			return
		}
		var b kmsg.RecordBatch
		if err := b.ReadFrom(raw[:12+n]); err != nil || !fn(b) {
			return
		}
		raw = raw[12+n:]
	}
}

// markerType reads the marker of control batch b: its one record's key is
// a version (2 bytes) and a type (2 bytes: 0 ABORT, 1 COMMIT). ok is false
// for a key of another shape.
func markerType(b kmsg.RecordBatch) (commit, ok bool) {
	r := kmsg.NewRecord()
	if r.ReadFrom(b.Records) != nil || len(r.Key) < 4 {
		return false, false
	}
	switch binary.BigEndian.Uint16(r.Key[2:4]) {
	case 0:
		return false, true
	case 1:
		return true, true
	}
	return false, false
}

// isCommitMarker reports whether control batch b is a COMMIT marker.
func isCommitMarker(b kmsg.RecordBatch) bool {
	commit, ok := markerType(b)
	return ok && commit
}
