package main

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// defaultTransactionTimeout is --transaction-timeout's default: how long
// the broker lets a transaction of kpar forward --exactly-once stay open
// before it aborts it. franz-go's default is 40s. kpar forward ends a
// transaction every --commit-interval (2ms) while records finish, so one
// is open for the time its outputs take to produce, well under a second;
// the timeout matters only for a forwarder that dies mid-transaction. A
// restart with the same transactional ID aborts that transaction at once
// (kpar initialises its producer before joining the group), but one of
// another ID (a host name that changed, without --instance-id) holds the
// group's committed offsets, and so every member's start, until it times
// out: 10s bounds that wait while leaving a slow broker ample room.
const defaultTransactionTimeout = 10 * time.Second

// txnFlags are kpar forward's exactly-once flags beyond --exactly-once.
type txnFlags struct {
	timeout *time.Duration
}

func addTxnFlags(fs *flagSet) txnFlags {
	return txnFlags{
		timeout: fs.Duration("transaction-timeout", defaultTransactionTimeout, "with --exactly-once, how long the broker lets a transaction stay open before aborting it (franz-go's default is 40s): a forwarder killed mid-transaction holds its group's offsets this long at most when it restarts under another transactional ID (without --instance-id, a new host name); 1s to 15m"),
	}
}

// check returns the usage error of a bad timeout or one given without
// --exactly-once.
func (x txnFlags) check(fs *flagSet, exactlyOnce bool) (code int, ok bool) {
	switch {
	case fs.given("transaction-timeout") && !exactlyOnce:
		return fs.usageError("invalid --transaction-timeout: it needs --exactly-once"), false
	case *x.timeout < time.Second || *x.timeout > 15*time.Minute:
		return fs.usageError("invalid --transaction-timeout %v: want 1s to 15m (a broker's transaction.max.timeout.ms is 15m by default)", *x.timeout), false
	}
	return 0, true
}

// opts are the options of the transactional producer. kpar gives
// ClientOptions to every client it makes; a transaction timeout means
// nothing to those that do not produce transactionally.
func (x txnFlags) opts(exactlyOnce bool) []kpar.ConsumerOpt {
	if !exactlyOnce {
		return nil
	}
	return []kpar.ConsumerOpt{kpar.ClientOptions(kgo.TransactionTimeout(*x.timeout))}
}

// attrs are the start-up line's attributes of the flags.
func (x txnFlags) attrs(exactlyOnce bool) []any {
	if !exactlyOnce {
		return nil
	}
	return []any{"transaction_timeout", *x.timeout}
}
