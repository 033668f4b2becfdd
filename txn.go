package kpar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar/deadletter"
)

// pendingOutput is the outputs of one finished record (or batch), waiting
// for the transaction that commits it, with what refit needs to put the
// record's dead letter in their place.
type pendingOutput struct {
	ps       *partState
	offset   int64 // the record's (the batch's last) offset in ps
	recs     []*kgo.Record
	in       *kgo.Record // the input, as its handler saw it
	attempts int
	kind     outputKind
	letter   *deadletter.Letter // the input's letter: outRetry, outDeadLetter
	cut      int                // the cut stage of a dead letter (deadletter.KafkaSink.Cut)
}

// outputKind is what a record's outputs are.
type outputKind uint8

const (
	outHandler    outputKind = iota // what its handler emitted
	outRetry                        // its record in its next retry topic
	outDeadLetter                   // its dead letter
)

// pendOutputs queues the outputs of t, which just finished, for the
// transaction that commits it. Called with mu held.
func (e *engine) pendOutputs(ps *partState, t *task) {
	x := t.Value.x
	if x == nil || len(x.outputs) == 0 {
		return
	}
	e.pendingOutputs = append(e.pendingOutputs, pendingOutput{
		ps: ps, offset: t.Value.rec.Offset, recs: x.outputs, in: t.Value.original(), attempts: t.Value.totalAttempts(),
		kind: x.outKind, letter: x.outLetter,
	})
	x.outputs, x.outLetter = nil, nil
}

// ExactlyOnce makes a consumer group member's outputs (Emit) exactly once:
// the outputs of the records a commit marks finished, and that commit (the
// window start and the finished set above it, TxnOffsetCommit), form one
// Kafka transaction, so a reader with read_committed isolation sees each
// input's outputs exactly once, across crashes and rebalances. The
// transaction carries the group's member ID and generation (or epoch), so
// a member that lost its partitions (a zombie) cannot commit them (KIP-447).
// Records still in flight go into the next transaction: nothing stops while
// one ends. A transaction ends at most once per CommitInterval, and not at
// all while nothing finishes.
//
// Source topics are read read_committed. Dead letters (a Kafka sink is then
// required: deadletter.NewKafkaSink) and retry-topic records join the
// transaction as the record's outputs, so they too appear exactly once.
// The transactional ID is TransactionalID's, else "<group>-<InstanceID>";
// one of the two is required: a stable ID lets a restarted member abort
// its predecessor's open transaction at once, instead of readers waiting
// for the transaction timeout. A share group or a Backfill cannot take it:
// neither commits offsets a transaction could hold.
//
// Through a broker's restart: a transaction whose commit got no answer
// (the broker died after it took it) is read back from the group's
// committed offsets until the broker answers, and nothing else commits
// meanwhile, so its outputs are neither lost nor produced twice. A
// producer the broker fenced (a restart that aborted its open transaction
// moves its epoch on, and franz-go then holds it failed for good) is
// replaced by a new one; after 5 in a row with no transaction committed in
// between, Run ends with ErrProducerFenced: another producer runs with the
// member's transactional ID.
// Default: off.
func ExactlyOnce() ConsumerOpt { return consumerOpt(func(c *cfg) { c.exactlyOnce = true }) }

// TransactionalID sets the transactional ID of ExactlyOnce's producer,
// overriding the default "<group>-<InstanceID>". Each running member needs
// its own, the same across its restarts.
func TransactionalID(id string) ConsumerOpt {
	return consumerOpt(func(c *cfg) { c.transactionalID = id })
}

// txnID is the transactional ID of ExactlyOnce's producer.
func (c *cfg) txnID() string {
	if c.transactionalID != "" {
		return c.transactionalID
	}
	return c.group + "-" + c.instanceID
}

// validateOutputs checks what Outputs and ExactlyOnce need.
func (c *cfg) validateOutputs() error {
	if !c.exactlyOnce {
		return nil
	}
	switch {
	case c.shareGroup != "":
		return errors.New("kpar: ExactlyOnce is not supported with ShareGroup: a share group has no offsets a transaction could commit; use Outputs (at least once)")
	case c.transactionalID == "" && c.instanceID == "":
		return errors.New("kpar: ExactlyOnce needs InstanceID or TransactionalID: a stable transactional ID lets a restarted member abort its predecessor's open transaction at once")
	case c.deadLetters != nil && !isKafkaSink(c.deadLetters):
		return fmt.Errorf("kpar: ExactlyOnce needs a Kafka dead-letter sink in DeadLetters (deadletter.NewKafkaSink), not %T: dead letters join the transaction", c.deadLetters)
	}
	return nil
}

// isKafkaSink reports whether s writes dead letters to Kafka, which a
// transaction can hold.
func isKafkaSink(s deadletter.Sink) bool {
	_, ok := s.(*deadletter.KafkaSink)
	return ok
}

// commitTxn is the group source's commit with ExactlyOnce. It takes, under
// the pipeline's lock at once, each partition's window start and finished
// set and the outputs of the records finished so far: exactly the outputs
// that commit marks finished. With outputs, both go in one transaction;
// without, the commit is a plain one (there is nothing to make atomic).
// A failed transaction is aborted and its outputs go into the next one, in
// front of the newer ones: their records stay finished in the windows, and
// the next commit includes them again. Called with g.commitMu held.
//
// A transaction that failed because an output was too large for its topic
// goes again at once, with the input's dead letter in that output's place
// (refit): as the running case would after the settler's backoff, and at a
// stop, where the final commit has no next settle, so that it ends cleanly.
func (g *groupSource) commitTxn(ctx context.Context, only []*partState) error {
	e := g.e
	if g.unknown != nil {
		// Nothing commits before the outcome of the last transaction is
		// known: a commit covers its records, which must not be without
		// their outputs, nor with them twice.
		if err := g.settleUnknown(ctx); err != nil {
			return err
		}
	}
	for attempt := 1; ; attempt++ {
		// The transaction commits as the member that held the partitions
		// when it took their outputs: read before the snapshot, a newer
		// generation's commit is refused and goes again, never the other
		// way round (a transaction of partitions lost in between, whose
		// flush outlived a broker outage, committed in the name of the
		// member that got them back and was handling their records again:
		// their replies twice).
		member := groupMember(g.cl)
		e.mu.Lock()
		todo := g.snapshotLocked(only)
		outs := e.takeOutputs()
		var ended chan struct{}
		if len(outs) > 0 {
			ended = make(chan struct{})
			g.inTxn, g.txnEnded = inTxnOf(outs), ended
		}
		e.mu.Unlock()
		if len(outs) == 0 {
			if len(todo) == 0 {
				return nil
			}
			_, err := g.commitParts(ctx, todo)
			return err
		}
		again, err := g.runTxn(ctx, member, todo, outs, attempt)
		close(ended) // once what it gave back to lost partitions is there
		if !again {
			return err
		}
	}
}

// runTxn runs one transaction of commitTxn. When it fails, its outputs go
// back to wait for the next one, those of partitions lost meanwhile to
// what was kept of them; again reports that the next one should go at
// once (refit).
func (g *groupSource) runTxn(ctx context.Context, member groupIdentity, todo []commitPart, outs []pendingOutput, attempt int) (again bool, _ error) {
	e := g.e
	refitted, endedCommit, err := g.transact(ctx, member, todo, outs)
	if errors.Is(err, errTxnOutcomeUnknown) {
		// Parked, its records still in inTxn: a loss keeps them waiting
		// for it, as for a transaction in flight.
		g.unknown = &unknownTxn{todo: todo, outs: outs}
		e.mu.Lock()
		e.askCommit()
		e.mu.Unlock()
		return false, err
	}
	again = err != nil && refitted && attempt < maxRefitAttempts && ctx.Err() == nil
	return again, g.ended(outs, endedCommit, err, again)
}

// ended ends a transaction that committed (err nil) or failed with err:
// its outputs go back to wait for the next one, those of partitions lost
// meanwhile to what was kept of them, unless it asked to commit
// (endedCommit; it may have committed after all: their records run
// again). again says that the next one goes at once; else the settler
// tries after its backoff. Called with commitMu held.
func (g *groupSource) ended(outs []pendingOutput, endedCommit bool, err error, again bool) error {
	e := g.e
	e.mu.Lock()
	g.inTxn = nil
	if err == nil {
		e.mu.Unlock()
		return nil
	}
	lost := e.putBackOutputs(outs)
	if endedCommit {
		lost = nil
	} else {
		lost = e.regain(lost) // aborted for sure: none of them is visible
	}
	if !again {
		e.askCommit()
	}
	e.mu.Unlock()
	if len(lost) > 0 {
		g.lost.returned(lost, e.cfg.maxBytes)
	}
	return err
}

// unknownTxn is a transaction whose commit failed with an outcome the
// broker did not tell before the run began to stop: its commit (todo) and
// outputs, parked until the group's offsets tell (settleUnknown).
type unknownTxn struct {
	todo []commitPart
	outs []pendingOutput
}

// settleUnknown reads whether the parked transaction committed: if it
// did, its commit counts; if not, it ended as an aborted one. It returns
// errTxnOutcomeUnknown while the broker does not tell. Called with
// commitMu held.
func (g *groupSource) settleUnknown(ctx context.Context) error {
	u := g.unknown
	landed, known := g.txnLanded(ctx, u.todo, nil)
	if !known {
		return errTxnOutcomeUnknown
	}
	g.unknown = nil
	if landed {
		g.txnCommitted(u.todo, nil)
		return g.ended(u.outs, false, nil, false)
	}
	g.ended(u.outs, false, errTxnOutcomeUnknown, false) // aborted for sure
	return nil
}

// maxRefitAttempts bounds the transactions one commit runs while outputs
// are refused as too large and refit: a dead letter is cut a stage further
// each time (deadletter.KafkaSink.Cut), and several records may not fit.
const maxRefitAttempts = 8

// takeOutputs takes the outputs waiting for a transaction, but those of
// partitions dropped meanwhile: their next owner handles their records,
// and emits again. Called with mu held.
func (e *engine) takeOutputs() []pendingOutput {
	outs := e.pendingOutputs[:0:0]
	for _, o := range e.pendingOutputs {
		if o.ps.status != dropped {
			outs = append(outs, o)
		}
	}
	clear(e.pendingOutputs)
	e.pendingOutputs = e.pendingOutputs[:0]
	return outs
}

// putBackOutputs puts the outputs of a failed transaction back in front of
// those that came since, and returns those of partitions lost while it
// ran, for what was kept of them (lostwork.go). Called with mu held.
func (e *engine) putBackOutputs(outs []pendingOutput) (lost []pendingOutput) {
	live := outs[:0]
	for _, o := range outs {
		if o.ps.status == dropped {
			lost = append(lost, o)
		} else {
			live = append(live, o)
		}
	}
	e.pendingOutputs = append(live, e.pendingOutputs...)
	return lost
}

// outputInTxn is an output a transaction in flight holds: its record.
type outputInTxn struct {
	ps     *partState
	offset int64
}

// inTxnOf is the records whose outputs are outs.
func inTxnOf(outs []pendingOutput) []outputInTxn {
	if len(outs) == 0 {
		return nil
	}
	in := make([]outputInTxn, len(outs))
	for i, o := range outs {
		in[i] = outputInTxn{o.ps, o.offset}
	}
	return in
}

// transact runs one transaction: the outputs, then the commit of todo
// (AddOffsetsToTxn and TxnOffsetCommit, with the member's ID and generation
// so that a zombie is fenced), then its end. Any failure aborts it.
// refitted reports that outs changed for the next one: an output too large
// for its topic gave way to its input's dead letter (refit); endedCommit
// that it asked the broker to commit it, so that a failure may still have
// committed it.
func (g *groupSource) transact(ctx context.Context, member groupIdentity, todo []commitPart, outs []pendingOutput) (refitted, endedCommit bool, _ error) {
	e := g.e
	// A transaction ends even when ctx is done (the settler stops at
	// shutdown): one left open would refuse the next to begin.
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	txn, err := g.begin(ctx, endCtx) // txnrenew.go
	if err != nil {
		return false, false, err
	}
	// A producer ID franz-go could not load (no broker reachable) is
	// loaded again by the produces, and while records wait for it kgo's
	// sink retries without a pause: 25,000 tries a second, each logged
	// ("unable to load producer ID"), for the whole outage. A transaction
	// that cannot have its ID now fails before it produces anything, and
	// the settler's backoff paces the next.
	if _, _, err := txn.ProducerID(ctx); err != nil {
		if abortErr := txn.EndTransaction(endCtx, kgo.TryAbort); abortErr != nil {
			err = fmt.Errorf("%w (aborting it: %w)", err, abortErr)
		}
		return false, false, fmt.Errorf("kpar: the transaction's producer ID: %w", err)
	}
	var (
		mu          sync.Mutex
		produceErr  error
		refusedOuts map[int]outputRefusal // outs' index -> its output refused as too large
	)
	for i, o := range outs {
		for _, r := range o.recs {
			// A copy: a record produced in an aborted transaction carries
			// that produce's state (its context, offset, producer ID).
			r := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}
			txn.Produce(ctx, r, func(r *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					produceErr = cmpOr(produceErr, err)
					if isTooLarge(err) {
						if refusedOuts == nil {
							refusedOuts = make(map[int]outputRefusal)
						}
						if _, ok := refusedOuts[i]; !ok {
							refusedOuts[i] = outputRefusal{r, err}
						}
					}
					mu.Unlock()
				}
			})
		}
	}
	err = txn.Flush(ctx)
	if err != nil {
		// The flush gave up (ctx done: a stop while the broker is away)
		// with records still buffered. They must not go out in the next
		// transaction, beside the same outputs produced again there.
		if abortErr := txn.AbortBufferedRecords(endCtx); abortErr != nil {
			e.log.Warn("kpar: failing the outputs still buffered for an aborted transaction failed", "err", abortErr)
		}
	}
	mu.Lock()
	err = cmpOr(err, produceErr)
	refused := refusedOuts
	mu.Unlock()
	// The transaction aborts below; what made it fail gives way before the
	// next one, which takes the rest as they are.
	guilty := false
	for i, r := range refused {
		if e.out.guilty(endCtx, r.rec) {
			guilty = true
			refitted = e.refit(endCtx, &outs[i], r.rec, r.err) || refitted
		}
	}
	for _, r := range refused {
		if !guilty { // refused for their batch alone: produced again as they are
			e.warnBatchTooLarge(r.rec.Topic, r.err)
		}
		break
	}
	var asked map[string]map[int32]int64
	var tooLarge []*commitPart
	if err == nil && len(todo) > 0 {
		asked, tooLarge, err = g.txnOffsetCommit(ctx, txn, member, todo)
	}
	end := kgo.TryCommit
	if err != nil {
		end = kgo.TryAbort
	}
	endErr := txn.EndTransaction(endCtx, end)
	if endErr != nil && end == kgo.TryCommit {
		// The commit's outcome is unknown: end the transaction for sure,
		// then read back whether its commit landed. If it did, its
		// outputs are visible: producing them again would repeat them.
		if abortErr := txn.EndTransaction(endCtx, kgo.TryAbort); abortErr != nil {
			e.log.Warn("kpar: aborting a transaction whose commit failed failed too", "commit_err", endErr, "err", abortErr)
		}
		switch landed, known := g.txnLanded(ctx, todo, endErr); {
		case !known:
			// Neither produced again (it may have committed) nor dropped
			// (it may not have): parked (runTxn) until it is known.
			return refitted, true, fmt.Errorf("%w: %w", errTxnOutcomeUnknown, endErr)
		case landed:
			endErr = nil
		}
	}
	if endErr != nil || err != nil {
		if errors.Is(endErr, kerr.ProducerFenced) || errors.Is(endErr, kerr.InvalidProducerEpoch) {
			endErr = fmt.Errorf("%w: the producer of transactional ID %q was fenced, by a broker that restarted and aborted its transaction, or by another producer with that ID (give every member its own: TransactionalID or InstanceID); the next transaction renews it", endErr, e.cfg.txnID())
		}
		if len(todo) > 0 {
			g.committed(todo, nil, tooLarge)
		}
		return refitted, end == kgo.TryCommit, fmt.Errorf("kpar: transaction aborted; its outputs go into the next one: %w", errors.Join(err, endErr))
	}
	g.txnCommitted(todo, asked)
	return false, true, nil
}

// txnCommitted records the commit of a transaction that committed: asked
// are the offsets that landed, nil for all of todo's. Called with
// commitMu held.
func (g *groupSource) txnCommitted(todo []commitPart, asked map[string]map[int32]int64) {
	g.renewals = 0
	if asked == nil {
		asked = askedOffsets(todo)
	}
	g.committed(todo, asked, nil)
	g.lost.landed(todo)
	for _, h := range g.e.hooks.commit {
		h.OnCommit(asked, nil)
	}
}

// outputRefusal is an output a topic refused, and the error it gave.
type outputRefusal struct {
	rec *kgo.Record
	err error
}

// txnLanded reports whether the transaction that carried the commit of
// todo, whose end failed with endErr, committed: the group's committed
// offsets are todo's, metadata included. It reads them stable (KIP-447),
// so that a transaction still pending is waited for, and asks until the
// group's coordinator answers; known is false when ctx ended first. An
// EndTxn lost with a broker that died after it wrote the commit fails
// with a dial error while the broker is away: taking a failed read for
// "not committed" produced the committed outputs again (the fault
// matrix's broker restarts, exactly once: 3 to 1,644 replies twice).
func (g *groupSource) txnLanded(ctx context.Context, todo []commitPart, endErr error) (landed, known bool) {
	if len(todo) == 0 {
		return false, true
	}
	adm := kadm.NewClient(g.cl)
	for wait, asked := 100*time.Millisecond, 0; ; wait, asked = min(2*wait, 2*time.Second), asked+1 {
		resps, err := adm.FetchOffsets(kadm.RequireStable(ctx), g.e.cfg.group)
		if err == nil {
			err = resps.Error()
		}
		if err == nil {
			for _, p := range todo {
				r, ok := resps.Lookup(p.ps.topic, p.ps.partition)
				if !ok || r.At != p.offset || r.Metadata != p.meta {
					g.e.log.Info("kpar: the transaction whose commit had an unknown outcome did not commit; its outputs go into the next one",
						"topic", p.ps.topic, "partition", p.ps.partition, "its_offset", p.offset, "committed_offset", r.At, "same_metadata", r.Metadata == p.meta)
					return false, true
				}
			}
			g.e.log.Info("kpar: the transaction whose commit had an unknown outcome committed")
			return true, true
		}
		if errors.Is(err, kerr.UnstableOffsetCommit) && failedForGood(endErr) {
			// A transaction holds the offsets, and the broker refused to
			// commit this one with a code it calls final (txnrenew.go;
			// not CONCURRENT_TRANSACTIONS, which a commit in progress
			// answers, nor UNKNOWN_SERVER_ERROR): it stays open until it
			// is aborted (the next producer's initialisation does it, or
			// the transaction timeout), and it cannot commit.
			return false, true
		}
		if asked == 0 {
			g.e.log.Warn("kpar: a transaction's commit failed with an unknown outcome; reading the group's committed offsets until the broker answers, before anything else commits",
				"transactional_id", g.e.cfg.txnID(), "commit_err", endErr, "err", err)
		}
		select {
		case <-ctx.Done():
			return false, false
		case <-time.After(wait):
		}
	}
}

// errTxnOutcomeUnknown is the commit's error while a transaction's outcome
// is unknown.
var errTxnOutcomeUnknown = errors.New("kpar: a transaction's commit failed and the broker has not said whether it committed; nothing commits until it does (if the run stops first, a restart handles again what the last known commit does not cover, and each output appears once)")

// groupIdentity is a member's ID and generation (or epoch) in its group.
type groupIdentity struct {
	id         string
	generation int32
}

func groupMember(cl *kgo.Client) groupIdentity {
	id, generation := cl.GroupMetadata()
	return groupIdentity{id, generation}
}

// txnOffsetCommit adds the commit of todo to the open transaction of txn,
// in the name of member.
func (g *groupSource) txnOffsetCommit(ctx context.Context, txn *kgo.Client, member groupIdentity, todo []commitPart) (map[string]map[int32]int64, []*commitPart, error) {
	e := g.e
	id, epoch, err := txn.ProducerID(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("kpar: the transaction's producer ID: %w", err)
	}
	txnID := e.cfg.txnID()
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txnID, id, epoch, e.cfg.group
	addResp, err := add.RequestWith(ctx, txn)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kpar: adding the commit to the transaction (AddOffsetsToTxn): %w", err)
	}
	offsets, byTP := g.encode(todo)
	ids, err := g.topicIDs(ctx, offsets)
	if err != nil {
		return nil, nil, err
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = txnID, e.cfg.group, id, epoch
	req.MemberID, req.Generation = member.id, member.generation
	if e.cfg.instanceID != "" {
		req.InstanceID = kmsg.StringPtr(e.cfg.instanceID)
	}
	for topic, ps := range offsets {
		t := kmsg.NewTxnOffsetCommitRequestTopic()
		// Both: v6+ names a topic by its ID (KIP-1319), older versions
		// by its name.
		t.Topic, t.TopicID = topic, ids[topic]
		for p, o := range ps {
			rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch = p, o.Offset, -1
			meta := byTP[tp{topic: topic, partition: p}].meta
			rp.Metadata = &meta
			t.Partitions = append(t.Partitions, rp)
		}
		req.Topics = append(req.Topics, t)
	}
	resp, err := req.RequestWith(ctx, txn)
	if err != nil {
		return nil, nil, fmt.Errorf("kpar: committing offsets in the transaction (TxnOffsetCommit): %w", err)
	}
	asked := askedOffsets(todo)
	var tooLarge []*commitPart
	var commitErr error
	for _, t := range resp.Topics {
		for _, rp := range t.Partitions {
			tooLarge, commitErr = partitionCommitted(t.Topic, rp.Partition, rp.ErrorCode, asked, byTP, tooLarge, commitErr)
		}
	}
	if commitErr != nil {
		return nil, tooLarge, fmt.Errorf("kpar: committing offsets in the transaction (TxnOffsetCommit): %w", commitErr)
	}
	return asked, nil, nil
}

// topicIDs returns the IDs of the topics of offsets, from the metadata,
// cached (topicids.go: the request runs outside the cache's lock): a topic
// recreated under its name is forgotten (forgetTopic) with its ID.
func (g *groupSource) topicIDs(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) (map[string][16]byte, error) {
	ids, missing, gen := g.ids.lookup(offsets)
	if len(missing) == 0 {
		return ids, nil
	}
	tds, err := kadm.NewClient(g.cl).ListTopics(ctx, missing...)
	if err != nil {
		return nil, fmt.Errorf("kpar: reading the IDs of the topics to commit: %w", err)
	}
	for _, topic := range missing {
		td, ok := tds[topic]
		if !ok || td.Err != nil {
			return nil, fmt.Errorf("kpar: reading the ID of topic %q to commit: %v", topic, td.Err)
		}
		ids[topic] = td.ID
	}
	g.ids.store(ids, gen)
	return ids, nil
}

// cmpOr returns a, or b when a is nil.
func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
