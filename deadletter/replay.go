package deadletter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReplayOpt configures Replay.
type ReplayOpt interface{ applyReplay(*replayCfg) }

type replayCfg struct {
	to       string
	runID    string
	state    string
	filter   func(Letter) bool
	dryRun   bool
	onLetter func(ReplayEvent)
	batch    int
}

type replayOptFunc struct{ fn func(*replayCfg) }

func (o replayOptFunc) applyReplay(c *replayCfg) { o.fn(c) }

// ReplayTo sends every replayed record to topic, overriding the default:
// each dead letter's original topic.
func ReplayTo(topic string) ReplayOpt { return replayOptFunc{func(c *replayCfg) { c.to = topic }} }

// ReplayRunID names the replay run (required): [A-Za-z0-9._-], at most 200
// bytes. A dead letter is sent at most once per run id; see Replay.
func ReplayRunID(id string) ReplayOpt { return replayOptFunc{func(c *replayCfg) { c.runID = id }} }

// ReplayStateFile is the run's journal (required unless ReplayDryRun).
// Its directory is created if missing.
func ReplayStateFile(path string) ReplayOpt {
	return replayOptFunc{func(c *replayCfg) { c.state = path }}
}

// ReplayFilter replays only the dead letters fn accepts, overriding the
// default of all.
func ReplayFilter(fn func(Letter) bool) ReplayOpt {
	return replayOptFunc{func(c *replayCfg) { c.filter = fn }}
}

// ReplayDryRun sends nothing and writes no state: Replay reports, through
// ReplayOnLetter and its ReplayReport, what a real run would do now.
func ReplayDryRun() ReplayOpt { return replayOptFunc{func(c *replayCfg) { c.dryRun = true }} }

// ReplayOnLetter calls fn for every dead letter the filter accepts, before
// it is sent (or, with ReplayDryRun, instead), from the goroutine that
// called Replay.
func ReplayOnLetter(fn func(ReplayEvent)) ReplayOpt {
	return replayOptFunc{func(c *replayCfg) { c.onLetter = fn }}
}

// ReplayBatch sets how many records are journaled and produced together,
// overriding the default 500. It bounds what a crash leaves in doubt.
func ReplayBatch(n int) ReplayOpt { return replayOptFunc{func(c *replayCfg) { c.batch = n }} }

// ReplayEvent is one dead letter as Replay handles it.
type ReplayEvent struct {
	Letter    Letter
	Topic     string // where it goes
	Partition int32  // the partition it goes to, -1 when unknown (ReplayDryRun without a client)
	Skipped   bool   // already replayed by this run id: not sent again
	Duplicate bool   // another group's letter of the same record came first in this run: not sent again
	Truncated bool   // the sink cut the letter (Letter.Truncated): not sent, the record cannot be rebuilt from it
	InDoubt   bool   // ReplayDryRun only: in an interrupted batch; a real run checks the target first
}

// ReplayReport counts what Replay did.
type ReplayReport struct {
	RunID     string
	Read      int // dead letters read from the source
	Filtered  int // rejected by the filter
	Skipped   int // already replayed by this run id
	Duplicate int // letters of a record another group's letter already took in this run
	Truncated int // cut by the sink (Letter.Truncated): not sent
	Recovered int // in doubt after an interrupted run, found in the target, not sent again
	InDoubt   int // ReplayDryRun only: in doubt, would be checked in the target first
	Replayed  int // sent (with ReplayDryRun: would be sent)
}

var runIDRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// Replay sends the dead letters of src back to Kafka through cl: the
// original key, value and headers, plus HeaderReplayedFrom (the dead
// letter's ID, "topic/partition/offset" of the original record) and
// HeaderReplayRun (the run id). Each goes to its original topic (or
// ReplayTo's), to the partition with the original's number modulo the
// target's partition count, in source order, so the records of one original
// partition stay in order. A record that several groups dead-lettered is
// sent once per run, for the first of its letters (every group consuming
// the target reads it); filter by Letter.Group to replay one group's. A
// letter a KafkaSink had to cut (Letter.Truncated) is not sent: a record
// without its value is not the record; ReplayReport.Truncated counts them. The record timestamp is the time of the replay. cl must be built
// with kgo.RecordPartitioner(kgo.ManualPartitioner()); it is not closed.
//
// Idempotency. A run id names one replay; by default the CLI derives it
// from the source URL, the target and the filter, so re-running the same
// command resumes the same run. Replay keeps a journal of the run in the
// ReplayStateFile (JSON lines, fsynced, locked while a run is active so two
// processes cannot run the same id at once) and sends in batches:
//
//  1. it appends "pending" with the batch's IDs and the target partitions'
//     end offsets, then produces the batch and waits for every
//     acknowledgement;
//  2. it appends "sent" with the IDs.
//
// A re-run skips every ID journaled as sent. If the previous process died
// between 1 and 2, the batch is in doubt: before anything else the re-run
// reads the target partitions from the journaled end offsets to their
// current end and marks as sent the IDs found there carrying this run's
// HeaderReplayRun; the rest of the batch is sent again. So a dead letter is
// sent once per run id, crash or not, as long as the state file survives
// (a re-run without it, or with another run id, sends everything again).
// Dead letters that reached the source after a run are sent by the next
// run of the same id. A failed Replay returns its error with the journal
// consistent; run it again.
func Replay(ctx context.Context, src Source, cl *kgo.Client, opts ...ReplayOpt) (ReplayReport, error) {
	cfg := replayCfg{batch: 500}
	for _, o := range opts {
		o.applyReplay(&cfg)
	}
	rep := ReplayReport{RunID: cfg.runID}
	switch {
	case !runIDRE.MatchString(cfg.runID):
		return rep, fmt.Errorf("deadletter: invalid replay run id %q: want 1 to 200 of [A-Za-z0-9._-]", cfg.runID)
	case cfg.state == "" && !cfg.dryRun:
		return rep, errors.New("deadletter: replay needs a state file")
	case cl == nil && !cfg.dryRun:
		return rep, errors.New("deadletter: replay needs a Kafka client")
	case cl != nil && !cfg.dryRun && !honoursPartitionField(cl):
		return rep, errors.New("deadletter: replay needs a client built with kgo.RecordPartitioner(kgo.ManualPartitioner())")
	case cfg.batch < 1:
		cfg.batch = 1
	}

	var j *journal
	var err error
	if cfg.dryRun {
		j, err = peekJournal(cfg.state, cfg.runID)
	} else {
		j, err = openJournal(cfg.state, cfg.runID)
	}
	if err != nil {
		return rep, err
	}
	defer j.close()

	r := &replayer{ctx: ctx, cfg: cfg, cl: cl, j: j, rep: &rep, taken: make(map[string]bool)}
	if cl != nil {
		r.counts = &partitionCounts{cl: cl, n: make(map[string]int)}
	}
	if j.pending != nil && !cfg.dryRun {
		if err := r.recover(ctx); err != nil {
			return rep, err
		}
	}
	err = src.Read(ctx, r.add)
	if err == nil {
		err = r.flush(ctx)
	}
	return rep, err
}

type replayer struct {
	ctx    context.Context // Replay's, for the work done inside Source.Read callbacks
	cfg    replayCfg
	cl     *kgo.Client
	j      *journal
	rep    *ReplayReport
	counts *partitionCounts // nil without a client
	batch  []*kgo.Record
	ids    []string
	taken  map[string]bool // IDs read in this run, so that each is sent once
}

func (r *replayer) add(l Letter) error {
	r.rep.Read++
	if r.cfg.filter != nil && !r.cfg.filter(l) {
		r.rep.Filtered++
		return nil
	}
	id := l.ID()
	ev := ReplayEvent{Letter: l, Topic: r.cfg.to, Partition: -1}
	if ev.Topic == "" {
		ev.Topic = l.Record.Topic
	}
	switch {
	case l.Truncated():
		ev.Truncated = true
		r.rep.Truncated++
	case r.taken[id]:
		ev.Duplicate = true
		r.rep.Duplicate++
	case r.j.sent[id]:
		ev.Skipped = true
		r.rep.Skipped++
	case r.cfg.dryRun && r.j.inDoubt(id):
		ev.InDoubt = true
		r.rep.InDoubt++
	}
	if !ev.Truncated { // another group's whole letter may follow
		r.taken[id] = true
	}
	if r.counts != nil && !ev.Skipped {
		n, err := r.counts.get(r.ctx, ev.Topic)
		if err != nil {
			return err
		}
		ev.Partition = mapPartition(l.Record.Partition, n)
	}
	if r.cfg.onLetter != nil {
		r.cfg.onLetter(ev)
	}
	if ev.Skipped || ev.InDoubt || ev.Duplicate || ev.Truncated {
		return nil
	}
	r.rep.Replayed++
	if r.cfg.dryRun {
		return nil
	}
	hs := make([]kgo.RecordHeader, 0, len(l.Record.Headers)+2)
	hs = append(hs, l.Record.Headers...)
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderReplayedFrom, Value: []byte(id)},
		kgo.RecordHeader{Key: HeaderReplayRun, Value: []byte(r.cfg.runID)},
	)
	r.batch = append(r.batch, &kgo.Record{
		Topic:     ev.Topic,
		Partition: ev.Partition,
		Key:       l.Record.Key,
		Value:     l.Record.Value,
		Headers:   hs,
	})
	r.ids = append(r.ids, id)
	if len(r.batch) >= r.cfg.batch {
		return r.flush(r.ctx)
	}
	return nil
}

// flush journals, sends and journals again the current batch.
func (r *replayer) flush(ctx context.Context) error {
	if len(r.batch) == 0 {
		return nil
	}
	topics := make(map[string]bool)
	for _, rec := range r.batch {
		topics[rec.Topic] = true
	}
	ends, err := r.endOffsets(ctx, keys(topics))
	if err != nil {
		return err
	}
	if err := r.j.appendLine(journalLine{Op: opPending, IDs: r.ids, Ends: ends}); err != nil {
		return err
	}
	for _, rec := range r.batch {
		rec.Context = ctx
	}
	if err := r.cl.ProduceSync(ctx, r.batch...).FirstErr(); err != nil {
		return fmt.Errorf("deadletter: replaying %d records: %w", len(r.batch), err)
	}
	if err := r.j.appendLine(journalLine{Op: opSent, IDs: r.ids}); err != nil {
		return err
	}
	r.batch, r.ids = nil, nil
	return nil
}

func (r *replayer) endOffsets(ctx context.Context, topics []string) (map[string]map[int32]int64, error) {
	ends, err := kadm.NewClient(r.cl).ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("deadletter: listing end offsets of %s: %w", strings.Join(topics, ","), err)
	}
	return offsetMap(ends), nil
}

// recover settles the batch an interrupted run left pending: the IDs found
// in the target with this run's marker were sent.
func (r *replayer) recover(ctx context.Context) error {
	p := r.j.pending
	want := make(map[string]bool, len(p.IDs))
	for _, id := range p.IDs {
		want[id] = true
	}
	topics := make([]string, 0, len(p.Ends))
	for t := range p.Ends {
		topics = append(topics, t)
	}
	now, err := r.endOffsets(ctx, topics)
	if err != nil {
		return err
	}
	var found []string
	err = readPartitions(ctx, r.cl.Opts(), p.Ends, now, func(rec *kgo.Record) error {
		if string(lastHeader(rec.Headers, HeaderReplayRun)) != r.cfg.runID {
			return nil
		}
		id := string(lastHeader(rec.Headers, HeaderReplayedFrom))
		if want[id] {
			found = append(found, id)
			delete(want, id)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("deadletter: checking the interrupted batch: %w", err)
	}
	if err := r.j.appendLine(journalLine{Op: opSent, IDs: found}); err != nil {
		return err
	}
	r.rep.Recovered = len(found)
	return nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

const (
	opPending = "pending"
	opSent    = "sent"
)

// journalLine is one line of a replay state file. A "sent" line closes the
// open "pending" batch, if any.
type journalLine struct {
	Run  string                     `json:"run"`
	Op   string                     `json:"op"`
	IDs  []string                   `json:"ids"`
	Ends map[string]map[int32]int64 `json:"ends,omitempty"` // pending: target end offsets before sending
}

// journal is a replay run's state file.
type journal struct {
	f       *os.File // nil for a dry run
	run     string
	sent    map[string]bool
	pending *journalLine // the open batch of an interrupted run
	doubt   map[string]bool
}

func (j *journal) inDoubt(id string) bool { return j.doubt[id] }

// openJournal opens and locks path for run.
func openJournal(path, run string) (*journal, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("deadletter: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("deadletter: %w", err)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("deadletter: replay state %s is in use by another run: %w", path, err)
	}
	size, err := wholeLines(f)
	if err == nil {
		err = f.Truncate(size)
	}
	if err == nil {
		_, err = f.Seek(size, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("deadletter: %s: %w", path, err)
	}
	j := &journal{f: f, run: run}
	if err := j.load(io.NewSectionReader(f, 0, size), path); err != nil {
		f.Close()
		return nil, err
	}
	return j, nil
}

// peekJournal reads path, if it exists, without locking or changing it.
func peekJournal(path, run string) (*journal, error) {
	j := &journal{run: run, sent: map[string]bool{}}
	if path == "" {
		return j, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return j, nil
	}
	if err != nil {
		return nil, fmt.Errorf("deadletter: %w", err)
	}
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		b = nil
	}
	return j, j.load(bytes.NewReader(b), path)
}

func (j *journal) load(rd io.Reader, path string) error {
	j.sent = make(map[string]bool)
	br := bufio.NewReader(rd)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("deadletter: %s: %w", path, err)
		}
		var l journalLine
		if err := json.Unmarshal(line, &l); err != nil {
			return fmt.Errorf("deadletter: %s line %d: %w", path, n, err)
		}
		if l.Run != j.run {
			return fmt.Errorf("deadletter: %s belongs to replay run %q, not %q", path, l.Run, j.run)
		}
		switch l.Op {
		case opPending:
			j.pending = &l
		case opSent:
			for _, id := range l.IDs {
				j.sent[id] = true
			}
			j.pending = nil
		default:
			return fmt.Errorf("deadletter: %s line %d: unknown op %q", path, n, l.Op)
		}
	}
	j.doubt = make(map[string]bool)
	if j.pending != nil {
		for _, id := range j.pending.IDs {
			j.doubt[id] = true
		}
	}
	return nil
}

func (j *journal) appendLine(l journalLine) error {
	l.Run = j.run
	if l.IDs == nil {
		l.IDs = []string{}
	}
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if _, err := j.f.Write(b); err != nil {
		return fmt.Errorf("deadletter: writing replay state: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("deadletter: writing replay state: %w", err)
	}
	switch l.Op {
	case opPending:
		j.pending = &l
	case opSent:
		for _, id := range l.IDs {
			j.sent[id] = true
		}
		j.pending = nil
	}
	return nil
}

func (j *journal) close() {
	if j.f != nil {
		j.f.Close()
	}
}
