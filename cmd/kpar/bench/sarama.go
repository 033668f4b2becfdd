//go:build sarama

package bench

import (
	"context"
	"errors"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
)

func init() { runSarama = saramaGroup }

// saramaGroup is IBM/sarama's consumer group with a sequential handler per
// claimed partition (sarama runs each claim in its own goroutine), marking
// each message after handling it; sarama's default 1s autocommit.
func saramaGroup(ctx context.Context, e *env) error {
	cfg := sarama.NewConfig()
	cfg.ClientID = "kpar-bench"
	cfg.Version = sarama.V3_6_0_0
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	if e.heartbeat > 0 {
		cfg.Consumer.Group.Heartbeat.Interval = e.heartbeat
	}
	if e.fetchMaxWait > 0 {
		cfg.Consumer.MaxWaitTime = e.fetchMaxWait
	}
	g, err := sarama.NewConsumerGroup(e.brokers, e.group, cfg)
	if err != nil {
		return err
	}
	defer g.Close()
	h := saramaHandler{e}
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{e.topic}, h); err != nil {
			if errors.Is(err, sarama.ErrClosedConsumerGroup) || ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	return nil
}

type saramaHandler struct{ e *env }

func (saramaHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h saramaHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	var r kgo.Record // one per claim: the handler is sequential
	for {
		select {
		case m, ok := <-c.Messages():
			if !ok {
				return nil
			}
			r = kgo.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
			_ = h.e.handle(s.Context(), &r)
			s.MarkMessage(m, "")
		case <-s.Context().Done():
			return nil
		}
	}
}
