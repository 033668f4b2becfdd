package kpar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// initTransactions initialises ExactlyOnce's transactional producer before
// the member joins its group. Initialising a transactional ID fences the
// producer that used it before (a member killed mid-transaction) and makes
// the broker abort that producer's open transaction. Until that
// transaction ends, the broker answers the group's offset fetches
// UNSTABLE_OFFSET_COMMIT when it held a commit of the group's offsets
// (KIP-447), so a member that joined first waited, silently, for the
// predecessor's transaction timeout (franz-go's default 40s): its producer
// was initialised only by its first transaction, which needed records,
// which needed the offsets. Done here, the restart does not wait at all.
// A transaction of another transactional ID (a member restarted under a
// new host name, without InstanceID) still holds the offsets until its
// own timeout; the log says so.
func (e *engine) initTransactions(ctx context.Context) error {
	timeout, _ := e.out.cl.OptValue(kgo.TransactionTimeout).(time.Duration)
	id := e.cfg.txnID()
	e.log.Info("kpar: initialising the transactional producer: an open transaction of this transactional ID (a killed predecessor's) is aborted first; "+
		"one of another ID holds the group's offsets until its transaction timeout",
		"transactional_id", id, "transaction_timeout", timeout)
	start := time.Now()
	for wait := time.Second; ; wait = min(2*wait, 5*time.Second) {
		_, _, err := e.out.cl.ProducerID(ctx)
		switch {
		case err == nil:
			e.log.Info("kpar: transactional producer ready", "transactional_id", id, "took", time.Since(start).Round(time.Millisecond))
			return nil
		case ctx.Err() != nil:
			return nil // stopping: Run ends as it would have
		case sticksToTheProducer(err):
			return fmt.Errorf("kpar: initialising the transactional producer %q: %w", id, err)
		}
		// A broker that cannot be reached or answers a retriable error
		// (its transaction state still loading, say) is waited for, as
		// a group join is: franz-go loads the ID again on the next
		// call.
		e.log.Warn("kpar: initialising the transactional producer failed; retrying", "transactional_id", id, "err", err, "retry_in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
	}
}

// sticksToTheProducer reports whether franz-go keeps err as the producer's
// state for good: an error code the broker does not call retriable
// (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, say). Retrying on the same client
// would return it again; Run fails with it instead.
func sticksToTheProducer(err error) bool {
	var ke *kerr.Error
	return errors.As(err, &ke) && !ke.Retriable && !errors.Is(err, kerr.ConcurrentTransactions)
}
