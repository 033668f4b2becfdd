package kpar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// isFatal reports errors that retrying cannot fix: bad credentials and
// missing permissions. Run returns them instead of looping.
func isFatal(err error) bool {
	return errors.Is(err, kerr.SaslAuthenticationFailed) ||
		errors.Is(err, kerr.TopicAuthorizationFailed) ||
		errors.Is(err, kerr.GroupAuthorizationFailed) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed) ||
		errors.Is(err, kerr.IllegalSaslState) ||
		errors.Is(err, kerr.UnsupportedSaslMechanism) ||
		errors.Is(err, kerr.InconsistentGroupProtocol)
}

// fetchErrorLog logs fetch errors at most once a second, with the count of
// those it held back since: a broker that fails every fetch (a deleted
// topic, a broker down) would otherwise log thousands of lines a second.
// It belongs to one polling goroutine.
type fetchErrorLog struct {
	log  *slog.Logger
	last time.Time
	held int
}

func (l *fetchErrorLog) Warn(msg string, attrs ...any) {
	now := time.Now()
	if now.Sub(l.last) < time.Second {
		l.held++
		return
	}
	if l.held > 0 {
		attrs = append(attrs, "similar_errors_not_logged", l.held)
	}
	l.last, l.held = now, 0
	l.log.Warn(msg, attrs...)
}

// fatalFetchError logs the errors of a poll and returns the first one that
// retrying cannot fix (see isFatal), for the engine and RunMembers alike.
// who prefixes the error's text and attrs the log lines.
func fatalFetchError(fs kgo.Fetches, log *fetchErrorLog, who string, attrs ...any) error {
	var fatal error
	fs.EachError(func(topic string, partition int32, err error) {
		switch {
		case errors.Is(err, context.Canceled):
		case errors.Is(err, kerr.InconsistentGroupProtocol):
			if fatal == nil {
				fatal = fmt.Errorf("%w (%v)", ErrOrderingMismatch, err)
			}
		case errors.Is(err, kerr.UnreleasedInstanceID):
			log.Warn("kpar: waiting to join: the group's broker still holds this InstanceID for its previous member (UNRELEASED_INSTANCE_ID); in the consumer group protocol it is released when that member leaves, or when its session expires (the group's consumer.session.timeout.ms, 45s by default); give each running member its own ID",
				append(attrs, "err", err)...)
		case isFatal(err):
			if fatal == nil {
				fatal = fmt.Errorf("kpar: %sfatal error from the client (topic %q, partition %d): %w", who, topic, partition, err)
			}
		default:
			log.Warn("kpar: fetch error", append(attrs, "topic", topic, "partition", partition, "err", err)...)
		}
	})
	return fatal
}
