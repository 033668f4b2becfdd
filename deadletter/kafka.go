package deadletter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// KafkaSink writes dead letters to Kafka topics.
//
// Each dead letter becomes one record with the original's key and value and
// headers byte-for-byte, the original headers first and the dead-letter
// headers of the sink's dialect after them (see EncodeHeaders). The
// record's own timestamp is left to the client (the time of writing), so
// that the dead-letter topic's retention counts from the failure; the
// original timestamp travels in a header.
//
// Kafka cannot reject a duplicate, so a batch retried after a partial
// failure can store a letter twice; the Kafka Source drops the later copies.
//
// A letter too large for its topic. A dead letter is as large as its
// record, and the dead-letter topic (or the producer's
// ProducerBatchMaxBytes) may refuse what the source topic took: a 5 MB
// record on a topic whose max.message.bytes is 1 MB. Retrying cannot help,
// so when the broker or the client refuses a letter with MESSAGE_TOO_LARGE
// or RECORD_LIST_TOO_LARGE, Write writes it again alone, each time cutting
// more, until it fits:
//
//  1. whole, if it was refused within a batch (the batch was too large);
//  2. without its value;
//  3. also without its key, and without every original header larger than
//     1 KiB (name and value);
//  4. also without any original header, and with the error message cut to
//     its first KiB.
//
// The letter written keeps the record's coordinates (topic, partition,
// offset, timestamp), the group, the class and the error, and says what
// was left out: HeaderValueTruncated and HeaderValueOriginalBytes, the
// same for the key, HeaderHeadersDropped (their names) and
// HeaderMessageTruncated. Each cut letter is logged once at warn
// (SinkLogger). Letter.Truncated reports a cut letter, and Replay does not
// send one. When even the last stage is refused, Write returns an error
// saying to raise the topic's max.message.bytes; the caller retries it.
type KafkaSink struct {
	cl      *kgo.Client
	topic   func(string) string
	dialect HeaderDialect
	log     *slog.Logger
	manual  bool // cl's partitioner places records on Record.Partition
	counts  *partitionCounts
}

// KafkaSinkOpt configures a KafkaSink.
type KafkaSinkOpt interface{ applyKafka(*KafkaSink) }

type kafkaSinkOptFunc struct{ fn func(*KafkaSink) }

func (o kafkaSinkOptFunc) applyKafka(s *KafkaSink) { o.fn(s) }

// SinkTopicFunc names the dead-letter topic of each source topic, overriding the
// default "<topic>.dlq".
func SinkTopicFunc(fn func(src string) string) KafkaSinkOpt {
	return kafkaSinkOptFunc{func(s *KafkaSink) { s.topic = fn }}
}

// SinkTopic writes every dead letter to one topic, overriding the default
// "<topic>.dlq". An empty name keeps the default, so a flag left unset can
// be passed straight through.
func SinkTopic(name string) KafkaSinkOpt {
	if name == "" {
		return kafkaSinkOptFunc{func(*KafkaSink) {}}
	}
	return SinkTopicFunc(func(string) string { return name })
}

// SinkDialect sets the header names and encodings, overriding the default Kpar.
func SinkDialect(d HeaderDialect) KafkaSinkOpt {
	return kafkaSinkOptFunc{func(s *KafkaSink) { s.dialect = d }}
}

// SinkLogger sets the logger of the warnings about letters too large for
// their topic, overriding the default that discards.
func SinkLogger(l *slog.Logger) KafkaSinkOpt {
	return kafkaSinkOptFunc{func(s *KafkaSink) { s.log = l }}
}

// NewKafkaSink returns a sink that produces through cl.
//
// Partitions: a dead letter goes to the partition with its original's
// number when the dead-letter topic has that many partitions, else to the
// original partition modulo the dead-letter topic's partition count, so that
// the dead letters of one partition stay in one partition, in order. The
// sink sets Record.Partition, which only a client built with
// kgo.RecordPartitioner(kgo.ManualPartitioner()) honours: build a client
// for dead letters with it (the recommended setup; it may share seeds, TLS
// and SASL with your consumer). With any other partitioner the sink still
// works, and records are placed by that partitioner (by key); the original
// partition is in the headers either way. NewKafkaSink tells the two apart
// once, from cl's options. Partition counts are looked up once per topic
// with a metadata request and cached: counts only grow, so the mapping stays
// valid, but partitions added later are not used until a new sink is built.
//
// A missing dead-letter topic is created only if cl was built with
// kgo.AllowAutoTopicCreation() and the broker allows it; otherwise Write
// fails naming the topic, and keeps failing until someone creates it.
//
// Write produces every letter and waits for all acknowledgements
// (ProduceSync): "durable" means acknowledged by the broker under cl's
// RequiredAcks (all in-sync replicas by default). While the broker refuses
// the writes with retriable errors the client keeps retrying, and Write
// returns an error once ctx is done, at the client's pace: a batch waiting
// for a retry is failed when the client next looks at it, which can be up
// to kgo.MetadataMinAge (5 s by default) after the deadline, and an
// idempotent client waits for the outcome of a request already sent unless
// built with kgo.AllowIdempotentProduceCancellation() (the duplicates that
// may cause are dropped by readers). Close cl yourself after the last
// Write.
func NewKafkaSink(cl *kgo.Client, opts ...KafkaSinkOpt) *KafkaSink {
	s := &KafkaSink{
		cl:     cl,
		topic:  func(src string) string { return src + ".dlq" },
		log:    slog.New(slog.DiscardHandler),
		manual: honoursPartitionField(cl),
		counts: newPartitionCounts(cl),
	}
	for _, o := range opts {
		o.applyKafka(s)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

var _ Sink = (*KafkaSink)(nil)

// Records returns the records Write would produce for letters, on the
// partitions Write would choose, without producing them: for a caller that
// produces them itself, in a transaction say. A letter too large for its
// topic is not cut here: the caller's produce fails.
func (s *KafkaSink) Records(ctx context.Context, letters []Letter) ([]*kgo.Record, error) {
	recs := make([]*kgo.Record, 0, len(letters))
	for _, l := range letters {
		if l.Record == nil {
			return nil, errors.New("deadletter: dead letter without a record")
		}
		rec := s.record(ctx, l, nil)
		if s.manual {
			n, err := s.counts.get(ctx, rec.Topic)
			if err != nil {
				return nil, err
			}
			rec.Partition = mapPartition(l.Record.Partition, n)
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// Write implements Sink.
func (s *KafkaSink) Write(ctx context.Context, letters []Letter) error {
	if len(letters) == 0 {
		return nil
	}
	recs := make([]*kgo.Record, 0, len(letters))
	index := make(map[*kgo.Record]int, len(letters))
	for i, l := range letters {
		if l.Record == nil {
			return errors.New("deadletter: dead letter without a record")
		}
		rec := s.record(ctx, l, nil)
		if s.manual {
			n, err := s.counts.get(ctx, rec.Topic)
			if err != nil {
				return err
			}
			rec.Partition = mapPartition(l.Record.Partition, n)
		}
		index[rec] = i
		recs = append(recs, rec)
	}
	refused := make(map[int]error) // letter -> its refusal as too large
	var err error
	for _, res := range s.cl.ProduceSync(ctx, recs...) {
		switch {
		case res.Err == nil:
		case tooLarge(res.Err):
			refused[index[res.Record]] = res.Err
		case err == nil:
			err = res.Err
		}
	}
	if err != nil {
		return fmt.Errorf("deadletter: producing %d dead letters: %w", len(recs), err)
	}
	for _, i := range slices.Sorted(maps.Keys(refused)) {
		if err := s.writeShrunk(ctx, letters[i], recs[i].Partition, len(recs) == 1, refused[i]); err != nil {
			return err
		}
	}
	return nil
}

// record is l's dead letter: the original's key, value and headers, then
// the dialect's headers, then marks.
func (s *KafkaSink) record(ctx context.Context, l Letter, marks []kgo.RecordHeader) *kgo.Record {
	extra := EncodeHeaders(l, s.dialect)
	rec := &kgo.Record{
		Topic:   s.topic(l.Record.Topic),
		Key:     l.Record.Key,
		Value:   l.Record.Value,
		Headers: make([]kgo.RecordHeader, 0, len(l.Record.Headers)+len(extra)+len(marks)),
		Context: ctx,
	}
	rec.Headers = append(append(append(rec.Headers, l.Record.Headers...), extra...), marks...)
	return rec
}

// mapPartition keeps p when the target has more than p partitions, else
// wraps it around.
func mapPartition(p int32, n int) int32 {
	if p < 0 {
		p = -p
	}
	return p % int32(n)
}

// honoursPartitionField reports whether cl's partitioner puts every record
// on its Partition field, as kgo.ManualPartitioner does. It asks the
// partitioner itself rather than comparing types, since ManualPartitioner
// is a BasicConsistentPartitioner like any other.
func honoursPartitionField(cl *kgo.Client) (ok bool) {
	p, _ := cl.OptValue(kgo.RecordPartitioner).(kgo.Partitioner)
	if p == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	tp := p.ForTopic("__kpar_deadletter_probe")
	if _, backup := tp.(kgo.TopicBackupPartitioner); backup {
		return false
	}
	if _, sticky := tp.(kgo.TopicPartitionerOnNewBatch); sticky {
		return false
	}
	probe := &kgo.Record{Topic: "__kpar_deadletter_probe", Key: []byte("k")}
	if !tp.RequiresConsistency(probe) {
		return false
	}
	for _, want := range []int32{0, 5, 2} {
		probe.Partition = want
		if tp.Partition(probe, 7) != int(want) {
			return false
		}
	}
	return true
}

// partitionCounts caches the partition count of topics.
type partitionCounts struct {
	cl   *kgo.Client
	auto bool // ask the broker to create missing topics

	mu sync.Mutex
	n  map[string]int
}

func newPartitionCounts(cl *kgo.Client) *partitionCounts {
	auto, _ := cl.OptValue(kgo.AllowAutoTopicCreation).(bool)
	return &partitionCounts{cl: cl, auto: auto, n: make(map[string]int)}
}

// get returns topic's partition count, asking the cluster the first time.
// Retriable answers (a topic being created, a leader moving) are retried
// until ctx is done.
func (p *partitionCounts) get(ctx context.Context, topic string) (int, error) {
	p.mu.Lock()
	n, ok := p.n[topic]
	p.mu.Unlock()
	if ok {
		return n, nil
	}
	backoff := 50 * time.Millisecond
	for {
		n, err := p.lookup(ctx, topic)
		if err == nil {
			p.mu.Lock()
			p.n[topic] = n
			p.mu.Unlock()
			return n, nil
		}
		if !kerr.IsRetriable(err) || (errors.Is(err, kerr.UnknownTopicOrPartition) && !p.auto) {
			return 0, fmt.Errorf("deadletter: topic %q: %w", topic, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("deadletter: topic %q: %w (last: %v)", topic, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (p *partitionCounts) lookup(ctx context.Context, topic string) (int, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = p.auto
	resp, err := req.RequestWith(ctx, p.cl)
	if err != nil {
		return 0, err
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return 0, err
		}
		if len(t.Partitions) == 0 {
			return 0, kerr.LeaderNotAvailable
		}
		return len(t.Partitions), nil
	}
	return 0, kerr.UnknownTopicOrPartition
}
