package deadletter

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Cut returns l's dead letter cut at stage (1 to 3, the stages of
// KafkaSink's doc), on the partition Records chooses: for a caller that
// produces dead letters itself (in a transaction, say) and had l's refused
// as too large. A stage that cuts nothing more than the one before is
// passed over: it returns the stage it cut at. It returns an error once no stage is left, saying to raise
// the topic's max.message.bytes. The cut is logged at warn, as Write logs
// it.
func (s *KafkaSink) Cut(ctx context.Context, l Letter, stage int) (*kgo.Record, int, error) {
	if l.Record == nil {
		return nil, 0, fmt.Errorf("deadletter: dead letter without a record")
	}
	topic := s.topic(l.Record.Topic)
	stage = max(stage, 1)
	_, _, prev := shrunk(l, stage-1)
	for ; stage <= shrinkStages; stage++ {
		cut, marks, cuts := shrunk(l, stage)
		if stage > 1 && cuts == prev {
			continue // nothing more to cut at this stage
		}
		rec := s.record(ctx, cut, marks)
		if s.manual {
			n, err := s.counts.get(ctx, rec.Topic)
			if err != nil {
				return nil, 0, err
			}
			rec.Partition = mapPartition(l.Record.Partition, n)
		}
		s.warnCut(l, topic, marks, fmt.Errorf("refused as too large"))
		return rec, stage, nil
	}
	return nil, 0, fmt.Errorf("deadletter: %s refuses the dead letter of %s as too large even with its value, key and headers left out and its message cut: raise the max.message.bytes of %[1]s (and the producer's ProducerBatchMaxBytes), or use another sink", topic, l.ID())
}
