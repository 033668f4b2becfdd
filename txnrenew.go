package kpar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Renewing a fenced transactional producer. Under KIP-890 part 2, which
// Kafka 4 and kfake speak, franz-go holds a producer whose epoch the broker
// refused (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED) failed for good: every
// BeginTransaction after it returns "producer ID has a fatal, unrecoverable
// error". A broker that restarts does this to a live member: on its way up
// it aborts the transaction its stop left open and bumps that producer's
// epoch (kfake in memory; kpar broker's repair of a data dir a kill -9
// left). So does another producer initialising the same transactional ID.
// The member went on handling records and never committed again: not
// ready, nothing lost, until it was restarted. Kafka's Java producer leaves
// it to the application to close such a producer and make another; kpar
// does it: the transaction runs on a new client, whose InitProducerID
// fences only the failed one. The outputs of the aborted transaction wait
// for it, as after any abort.
//
// Two members with one transactional ID (a zombie beside its successor, or
// a configuration error) would renew in turn, each fencing the other. The
// one whose transactions never commit (the zombie: its group refuses its
// offset commits) gives up after maxRenewals renewals with no committed
// transaction in between, and Run ends with ErrProducerFenced.

// maxRenewals is how many times in a row a member renews its fenced
// producer without a transaction committing in between.
const maxRenewals = 5

// begin begins a transaction on the outputs' producer, and returns that
// producer. It aborts first one an earlier call could not end, and renews
// a producer that franz-go holds failed for good. Called with commitMu
// held.
func (g *groupSource) begin(ctx, endCtx context.Context) (*kgo.Client, error) {
	txn := g.e.out.cl
	err := txn.BeginTransaction()
	if err != nil && !failedForGood(err) {
		// One an earlier call could not end: abort it, and begin again.
		if abortErr := txn.EndTransaction(endCtx, kgo.TryAbort); abortErr != nil {
			err = fmt.Errorf("%w (aborting the one still open: %w)", err, abortErr)
		} else {
			err = txn.BeginTransaction()
		}
	}
	if err == nil {
		return txn, nil
	}
	if !failedForGood(err) {
		return nil, fmt.Errorf("kpar: beginning a transaction: %w", err)
	}
	if err := g.renewProducer(ctx, err); err != nil {
		return nil, err
	}
	txn = g.e.out.cl
	if err := txn.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("kpar: beginning a transaction on a new producer: %w", err)
	}
	return txn, nil
}

// failedForGood reports whether err says that franz-go holds the producer
// failed for good: a Kafka error code the broker does not call retriable.
// UNKNOWN_SERVER_ERROR is not one: franz-go reloads the producer ID after
// it.
func failedForGood(err error) bool {
	return sticksToTheProducer(err) && !errors.Is(err, kerr.UnknownServerError)
}

// renewProducer replaces the outputs' producer, failed for good with
// cause, by a new client, and initialises its producer ID; after
// maxRenewals in a row it ends the run with ErrProducerFenced instead.
// Called with commitMu held. Unlike initTransactions, which waits for the
// broker as long as it takes before the member joins, it tries for 10s
// only: commitMu is held, and a producer ID not loaded now is loaded by
// the next transaction's check (txn.go), which fails early meanwhile.
func (g *groupSource) renewProducer(ctx context.Context, cause error) error {
	e := g.e
	id := e.cfg.txnID()
	if g.renewals >= maxRenewals {
		err := fmt.Errorf("%w: transactional ID %q, fenced %d times with no transaction committed in between; the last: %w", ErrProducerFenced, id, g.renewals+1, cause)
		g.refusal.refuse(err)
		return err
	}
	g.renewals++
	e.log.Warn("kpar: the transactional producer was fenced: a new one takes its place, and the aborted transaction's outputs go into its first transaction. "+
		"A broker restart that aborted the open transaction does this once; if it repeats, another producer runs with this transactional ID (give every member its own)",
		"transactional_id", id, "err", cause, "renewals_in_a_row", g.renewals)
	cl, err := newOutputsClient(e.cfg)
	if err != nil {
		return err
	}
	// The new client first: kparprom's shared metrics live while one
	// client of the Consumer does.
	old := e.out.cl
	e.out.cl = cl
	old.Close()
	initCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, _, err := cl.ProducerID(initCtx); err != nil {
		// franz-go loads it again at the next BeginTransaction, or keeps
		// the error, and the next renewal counts.
		return fmt.Errorf("kpar: initialising a new transactional producer %q: %w", id, err)
	}
	e.log.Info("kpar: new transactional producer ready", "transactional_id", id, "took", time.Since(start).Round(time.Millisecond))
	return nil
}
