package kpar

import (
	"errors"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A topic that was deleted, or deleted and created again, makes every fetch
// of it fail with UNKNOWN_TOPIC_ID: the client keeps fetching the first
// instance of the topic by its ID and refuses the new one. Left alone, the
// consumer never reads the new topic. topicWatch notices it, has the client
// forget the topic and subscribe to it again (franz-go's documented way to
// follow a recreated topic: PurgeTopicsFromConsuming, then
// AddConsumeTopics), and tells the hooks that the topic is unavailable until
// its records flow again, so readiness checks can say so.

// topicGoneAfter is how long fetches of a topic must fail with
// UNKNOWN_TOPIC_OR_PARTITION before the topic is treated as gone: that error
// also comes and goes while a topic is being created or moved. The client
// surfaces UNKNOWN_TOPIC_ID only once its own retries gave up (about ten
// seconds after the topic changed), so that one counts at once.
const topicGoneAfter = time.Second

// topicReaddEvery is how often a gone topic is purged and subscribed again
// while it stays unknown (for instance while it does not exist yet).
const topicReaddEvery = 5 * time.Second

// topicWatch belongs to one polling goroutine.
type topicWatch struct {
	cl    *kgo.Client
	log   *slog.Logger
	regex bool // subscribed by regex: a purged topic is found again by itself
	hooks []HookTopicUnavailable
	// forget drops the consumer's state of a gone topic before the client
	// purges it, so that nothing of the old topic is committed under the
	// name of the new one.
	forget func(topic string)
	gone   map[string]*goneTopic
}

type goneTopic struct {
	since    time.Time // first failed fetch
	readded  time.Time // last purge and re-subscribe; zero before the first
	reported bool      // the hooks were told
}

// isTopicGone reports the fetch errors of a topic the broker no longer has
// under the ID the client knows.
func isTopicGone(err error) bool {
	return errors.Is(err, kerr.UnknownTopicID) || errors.Is(err, kerr.UnknownTopicOrPartition)
}

// observe looks at one poll's errors and records. It purges and
// re-subscribes topics that stay gone, and reports the topics that recover.
func (w *topicWatch) observe(fs kgo.Fetches, now time.Time) {
	var failing map[string]error
	fs.EachError(func(topic string, _ int32, err error) {
		if isTopicGone(err) {
			if failing == nil {
				failing = map[string]error{}
			}
			failing[topic] = err
		}
	})
	for topic, err := range failing {
		g := w.gone[topic]
		if g == nil {
			if w.gone == nil {
				w.gone = map[string]*goneTopic{}
			}
			g = &goneTopic{since: now}
			w.gone[topic] = g
		}
		settled := errors.Is(err, kerr.UnknownTopicID) || now.Sub(g.since) >= topicGoneAfter
		if !settled || now.Sub(g.readded) < topicReaddEvery {
			continue
		}
		if !g.reported {
			g.reported = true
			w.log.Warn("kpar: the broker no longer has this topic (deleted, or deleted and created again); subscribing to it afresh: a new topic is consumed from its start or its committed offsets",
				"topic", topic, "err", err)
			for _, h := range w.hooks {
				h.OnTopicUnavailable(topic, err)
			}
		}
		g.readded = now
		if w.forget != nil {
			w.forget(topic)
		}
		w.cl.PurgeTopicsFromConsuming(topic)
		if !w.regex {
			w.cl.AddConsumeTopics(topic)
		}
	}
	if len(w.gone) == 0 {
		return
	}
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		g := w.gone[p.Topic]
		if g == nil || failing[p.Topic] != nil || len(p.Records) == 0 {
			return
		}
		delete(w.gone, p.Topic)
		if g.reported {
			w.log.Info("kpar: consuming the topic again", "topic", p.Topic)
			for _, h := range w.hooks {
				h.OnTopicUnavailable(p.Topic, nil)
			}
		}
	})
}
