package embedded

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Transactions a kill cut in half. kfake ends a committed transaction in
// two steps: it writes the COMMIT markers into the partitions, then the
// transaction's offset commits into groups.log (kfake txns.go, endTx). A
// kill -9 between the two leaves the transaction's records visible and the
// group's offsets as they were: its consumer handles those records again,
// and a read_committed reader of their outputs sees them twice (1 kill in
// 80 of a loop of such transactions; about one soak run in six of the
// fault matrix's broker restarts under kpar forward --exactly-once). A
// kill in the middle of the markers leaves the transaction committed in
// some partitions and open in others. Neither the partitions nor
// groups.log tell what offsets the transaction committed: kfake keeps
// them in memory until the end. So, with a DataDir, the broker journals
// the offset commits of each transactional producer's latest transaction
// (TxnOffsetCommit, observed before kfake applies it) in TxnJournalFile,
// and the repair of a directory a kill left (cmd/kpar/broker_txn.go)
// completes a transaction with a COMMIT marker in the log: its markers in
// every partition it wrote to, and its offsets.
//
// The journal trusts a client to commit a transaction only if its offset
// commits succeeded, as Kafka's clients and kpar do: an offset commit the
// broker refused, in a transaction the client then committed anyway,
// would be applied by a repair.

// TxnJournalFile is the journal's file in the DataDir.
const TxnJournalFile = "kpar-txn-offsets.json"

// JournaledTxn is the offset commits of one transaction.
type JournaledTxn struct {
	TransactionalID string            `json:"transactional_id"`
	ProducerID      int64             `json:"producer_id"`
	Epoch           int16             `json:"epoch"`
	Group           string            `json:"group"`
	Offsets         []JournaledOffset `json:"offsets"`
}

// JournaledOffset is one partition's offset commit.
type JournaledOffset struct {
	Topic       string  `json:"topic"`
	Partition   int32   `json:"partition"`
	Offset      int64   `json:"offset"`
	LeaderEpoch int32   `json:"leader_epoch"`
	Metadata    *string `json:"metadata,omitempty"`
}

// ReadTxnJournal reads the journal of dir; none is no transaction.
func ReadTxnJournal(dir string) ([]JournaledTxn, error) {
	raw, err := os.ReadFile(filepath.Join(dir, TxnJournalFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var txns []JournaledTxn
	if err := json.Unmarshal(raw, &txns); err != nil {
		return nil, err
	}
	return txns, nil
}

// RemoveTxnJournal removes the journal of dir, once a repair applied it.
func RemoveTxnJournal(dir string) error {
	err := os.Remove(filepath.Join(dir, TxnJournalFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// txnJournal is the journal of a running broker. Its lock guards txns and
// the file; kfake runs controls one at a time, the lock is for Close.
type txnJournal struct {
	kc   *kfake.Cluster
	dir  string
	mu   sync.Mutex
	txns map[int64]*JournaledTxn // producer ID -> its latest transaction with offsets
}

// journalTxnOffsets starts the journal of kc, whose DataDir is dir. What a
// directory's journal held was applied by the repair before this start, or
// concerns transactions that ended whole.
func journalTxnOffsets(kc *kfake.Cluster, dir string) {
	j := &txnJournal{kc: kc, dir: dir, txns: map[int64]*JournaledTxn{}}
	kc.ControlKey(int16(kmsg.TxnOffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		j.offsets(kreq.(*kmsg.TxnOffsetCommitRequest))
		return nil, nil, false
	})
	kc.ControlKey(int16(kmsg.EndTxn), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.EndTxnRequest)
		j.ending(req.ProducerID, req.ProducerEpoch)
		return nil, nil, false
	})
}

// offsets journals the offset commits of req, added to those its
// transaction made before.
func (j *txnJournal) offsets(req *kmsg.TxnOffsetCommitRequest) {
	j.mu.Lock()
	defer j.mu.Unlock()
	t := j.txns[req.ProducerID]
	if t == nil || t.Epoch != req.ProducerEpoch || t.Group != req.Group {
		t = &JournaledTxn{TransactionalID: req.TransactionalID, ProducerID: req.ProducerID, Epoch: req.ProducerEpoch, Group: req.Group}
		j.txns[req.ProducerID] = t
	}
	for _, rt := range req.Topics {
		topic := rt.Topic
		if topic == "" { // v6+ may name it by its ID alone
			if info := j.kc.TopicIDInfo(rt.TopicID); info != nil {
				topic = info.Topic
			}
		}
		if topic == "" {
			continue
		}
	partitions:
		for _, rp := range rt.Partitions {
			o := JournaledOffset{Topic: topic, Partition: rp.Partition, Offset: rp.Offset, LeaderEpoch: rp.LeaderEpoch, Metadata: rp.Metadata}
			for i := range t.Offsets {
				if t.Offsets[i].Topic == topic && t.Offsets[i].Partition == rp.Partition {
					t.Offsets[i] = o
					continue partitions
				}
			}
			t.Offsets = append(t.Offsets, o)
		}
	}
	j.save()
}

// ending forgets the transactions of producer before epoch: the producer
// ends a later one, so kfake wrote theirs whole long ago.
func (j *txnJournal) ending(producer int64, epoch int16) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if t := j.txns[producer]; t != nil && t.Epoch < epoch {
		delete(j.txns, producer)
		j.save()
	}
}

// save writes the journal, whole: a temporary file renamed over the old
// one, so that a kill leaves one or the other. Called with mu held.
func (j *txnJournal) save() {
	txns := make([]JournaledTxn, 0, len(j.txns))
	for _, t := range j.txns {
		txns = append(txns, *t)
	}
	raw, err := json.Marshal(txns)
	if err != nil {
		return
	}
	path := filepath.Join(j.dir, TxnJournalFile)
	if err := os.WriteFile(path+".tmp", raw, 0o644); err != nil {
		return // a directory kfake cannot write either: it says so
	}
	_ = os.Rename(path+".tmp", path)
}
