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

// abortOrphanedTransactions writes the ABORT markers of the transactions
// that the broker which last used dir left open when it died, and reports
// them on stderr, one line. It does nothing after a clean stop: kfake then
// restores the open transactions, which their producers may still commit.
func abortOrphanedTransactions(ctx context.Context, cfg embedded.Config, stderr io.Writer) error {
	dir := cfg.DataDir
	if _, err := os.Stat(filepath.Join(dir, kfakeSessionState)); err == nil {
		return nil // a clean stop with something to restore
	}
	open, err := findOpenTransactions(dir)
	if err != nil || len(open) == 0 {
		return err
	}
	cfg.Addr = "127.0.0.1:0"
	c, err := embedded.Start(cfg)
	if err != nil {
		return err
	}
	err = writeAbortMarkers(ctx, c.Addr(), open)
	c.Close() // saves what the markers changed, and the bumped epochs
	if err != nil {
		return fmt.Errorf("writing the ABORT markers of the transactions left open in --data-dir %s: %w; without them read_committed readers would skip those producers' later transactions: start again, or use another --data-dir", dir, err)
	}
	var where []string
	producers := map[int64]bool{}
	for _, o := range open {
		where = append(where, fmt.Sprintf("%s/%d", o.topic, o.partition))
		producers[o.producer] = true
	}
	slices.Sort(where)
	where = slices.Compact(where)
	fmt.Fprintf(stderr, "kpar broker: the broker that used --data-dir %s did not stop cleanly (kill -9 or a crash): aborted the %d transaction(s) it left open (in %s); read_committed readers skip their records, their producers are fenced and retry in a new transaction\n",
		dir, len(producers), strings.Join(where, ", "))
	return nil
}

// findOpenTransactions reads the segment files of every partition in dir
// (kfake's layout: partitions/<escaped topic>-<n>/<base offset>.dat, each
// a run of Kafka record batches) and returns, per partition and producer,
// a transaction whose last transactional batch is data, not a marker.
func findOpenTransactions(dir string) ([]openTxn, error) {
	parts, err := os.ReadDir(filepath.Join(dir, "partitions"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
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
		found, err := openInPartition(filepath.Join(dir, "partitions", p.Name()))
		if err != nil {
			return nil, err
		}
		for _, o := range found {
			o.topic, o.partition = topic, int32(partition)
			open = append(open, o)
		}
	}
	return open, nil
}

// Record batch attributes (Kafka's RecordBatch format).
const (
	batchTransactional = 0x10
	batchControl       = 0x20
)

// openInPartition scans the segment files of one partition directory, in
// offset order, and returns the transactions still open at the end.
func openInPartition(pdir string) ([]openTxn, error) {
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
		// Each batch: base offset (8 bytes), length (4), then length
		// bytes. kfake ignores a torn batch at the end; so do we.
		for len(raw) >= 12 {
			n := int(binary.BigEndian.Uint32(raw[8:12]))
			if n < 0 || 12+n > len(raw) {
				break
			}
			var b kmsg.RecordBatch
			if err := b.ReadFrom(raw[:12+n]); err != nil {
				break
			}
			raw = raw[12+n:]
			switch {
			case b.Attributes&batchTransactional == 0:
			case b.Attributes&batchControl != 0:
				delete(open, b.ProducerID)
			default:
				if _, ok := open[b.ProducerID]; !ok {
					open[b.ProducerID] = openTxn{producer: b.ProducerID, epoch: b.ProducerEpoch, first: b.FirstOffset}
				}
			}
		}
	}
	var out []openTxn
	for _, o := range open {
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b openTxn) int { return cmp.Compare(a.first, b.first) })
	return out, nil
}

// writeAbortMarkers sends one WriteTxnMarkers request, an ABORT marker for
// each transaction of open, to the broker at addr.
func writeAbortMarkers(ctx context.Context, addr string, open []openTxn) error {
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
