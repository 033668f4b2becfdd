package kpar

import (
	"context"
	"errors"
	"log/slog"
	"sync"
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
	// announce, if set, tells the other members of a RunMembers that this
	// one found the topic gone (see goneNews).
	announce func(topic string)
	gone     map[string]*goneTopic
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
		g := w.entry(topic, now)
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
		w.readd(g, topic, now)
		if w.announce != nil {
			w.announce(topic)
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

// entry returns the record of gone topic, made if new.
func (w *topicWatch) entry(topic string, now time.Time) *goneTopic {
	g := w.gone[topic]
	if g == nil {
		if w.gone == nil {
			w.gone = map[string]*goneTopic{}
		}
		g = &goneTopic{since: now}
		w.gone[topic] = g
	}
	return g
}

// readd has the client forget topic and subscribe to it again.
func (w *topicWatch) readd(g *goneTopic, topic string, now time.Time) {
	g.readded = now
	if w.forget != nil {
		w.forget(topic)
	}
	w.cl.PurgeTopicsFromConsuming(topic)
	if !w.regex {
		w.cl.AddConsumeTopics(topic)
	}
}

// heard re-subscribes to a topic that another member found gone, unless
// this member did so itself within topicReaddEvery. The member that found
// it told the hooks, which RunMembers' members share, so this one does not;
// but whichever member gets the topic's records first tells them the topic
// is back: the finder's partitions of the new topic may have none.
func (w *topicWatch) heard(topic string, now time.Time) {
	g := w.entry(topic, now)
	g.reported = true
	if now.Sub(g.readded) < topicReaddEvery {
		return
	}
	w.readd(g, topic, now)
}

// goneNews passes a gone topic from the member of a RunMembers that found
// it to the others. Left to itself, a client finds a recreated topic only
// once franz-go stops retrying UNKNOWN_TOPIC_ID: after six failed fetches
// of a partition, which its fetch backoff spaces up to 5 s apart. So the
// member handed a partition of the recreated topic in the rebalance that
// the finder's re-subscription causes would wait about 30 s more, still
// fetching by the old topic ID. Members in other processes still find it
// that way.
type goneNews struct {
	mu     sync.Mutex
	seq    uint64             // announcements so far; guarded by mu
	topics map[string]uint64  // topic -> seq of its last announcement; guarded by mu
	wake   context.Context    // cancelled at the next announcement; guarded by mu
	cancel context.CancelFunc // cancels wake; guarded by mu
}

func newGoneNews() *goneNews {
	n := &goneNews{topics: map[string]uint64{}}
	n.wake, n.cancel = context.WithCancel(context.Background())
	return n
}

// announce records topic as gone and wakes the members' polls.
func (n *goneNews) announce(topic string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	n.topics[topic] = n.seq
	n.cancel()
	n.wake, n.cancel = context.WithCancel(context.Background())
}

// since returns the topics announced after the seen-th announcement, the
// number of announcements so far, and a context cancelled at the next one.
func (n *goneNews) since(seen uint64) (topics []string, now uint64, wake context.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for topic, seq := range n.topics {
		if seq > seen {
			topics = append(topics, topic)
		}
	}
	return topics, n.seq, n.wake
}
