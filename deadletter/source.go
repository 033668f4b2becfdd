package deadletter

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// OpenSource opens the dead letters at rawURL:
//
//   - kafka://HOST:PORT[,HOST:PORT...]/TOPIC[,TOPIC...] reads the topics'
//     partitions from their start offsets to the high watermarks they had
//     when OpenSource ran, then stops; records written later are left for
//     the next OpenSource. It reads with a direct consumer (no group, no
//     committed offsets) and decodes each record with FromRecord. Plain
//     connections only (no TLS or SASL).
//   - file://PATH reads a FileSink file; PATH is everything after file://,
//     so file:///var/dlq.jsonl is absolute and file://dlq.jsonl relative.
//     A torn last line (crash mid-write) is ignored.
//
// PostgreSQL tables are read by OpenSource of the module
// github.com/kpar/kpar/deadletter/pgsink, which keeps the driver out of
// programs that do not need it.
//
// Every source drops later copies of a letter it already passed on (same
// group and original topic, partition and offset), keeping the first.
func OpenSource(ctx context.Context, rawURL string) (Source, error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, fmt.Errorf("deadletter: source %q: want kafka:// or file://", rawURL)
	}
	switch strings.ToLower(scheme) {
	case "kafka":
		brokers, topics, err := ParseKafkaURL(rawURL)
		if err != nil {
			return nil, err
		}
		return OpenKafkaSource(ctx, brokers, topics)
	case "file":
		if rest == "" {
			return nil, fmt.Errorf("deadletter: source %q: no path", rawURL)
		}
		return fileSource{path: rest}, nil
	case "postgres", "postgresql":
		return nil, fmt.Errorf("deadletter: source %q: PostgreSQL sources are opened by pgsink.OpenSource (module github.com/kpar/kpar/deadletter/pgsink)", rawURL)
	}
	return nil, fmt.Errorf("deadletter: source %q: unknown scheme %q (want kafka or file)", rawURL, scheme)
}

// ParseKafkaURL splits kafka://HOST:PORT[,HOST:PORT...]/TOPIC[,TOPIC...]
// into its brokers and topics.
func ParseKafkaURL(rawURL string) (brokers, topics []string, err error) {
	rest, ok := strings.CutPrefix(rawURL, "kafka://")
	if !ok {
		return nil, nil, fmt.Errorf("deadletter: %q is not a kafka:// URL", rawURL)
	}
	hosts, path, _ := strings.Cut(rest, "/")
	for _, b := range strings.Split(hosts, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	for _, t := range strings.Split(path, ",") {
		if t = strings.TrimSpace(t); t != "" {
			topics = append(topics, t)
		}
	}
	if len(brokers) == 0 || len(topics) == 0 {
		return nil, nil, fmt.Errorf("deadletter: source %q: want kafka://HOST:PORT[,HOST:PORT...]/TOPIC[,TOPIC...]", rawURL)
	}
	return brokers, topics, nil
}

// kafkaSource reads dead-letter topics up to the high watermarks they had
// at open time.
type kafkaSource struct {
	opts  []kgo.Opt
	start map[string]map[int32]int64
	end   map[string]map[int32]int64
}

// OpenKafkaSource is OpenSource for a kafka:// URL, with extra client
// options (TLS, SASL, a logger) for the clients it creates; options that
// configure consuming are dropped.
func OpenKafkaSource(ctx context.Context, brokers, topics []string, opts ...kgo.Opt) (Source, error) {
	s, err := openKafkaSource(ctx, brokers, topics, opts...)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func openKafkaSource(ctx context.Context, brokers, topics []string, opts ...kgo.Opt) (*kafkaSource, error) {
	if len(brokers) == 0 || len(topics) == 0 {
		return nil, errors.New("deadletter: a Kafka source needs brokers and topics")
	}
	opts = append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, withoutConsuming(opts)...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("deadletter: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("deadletter: listing end offsets of %s: %w", strings.Join(topics, ","), err)
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("deadletter: listing start offsets of %s: %w", strings.Join(topics, ","), err)
	}
	s := &kafkaSource{opts: opts, start: offsetMap(starts), end: offsetMap(ends)}
	for _, t := range topics {
		if len(s.end[t]) == 0 {
			return nil, fmt.Errorf("deadletter: topic %q not found", t)
		}
	}
	return s, nil
}

func offsetMap(l kadm.ListedOffsets) map[string]map[int32]int64 {
	m := make(map[string]map[int32]int64)
	l.Each(func(o kadm.ListedOffset) {
		if m[o.Topic] == nil {
			m[o.Topic] = make(map[int32]int64)
		}
		m[o.Topic][o.Partition] = o.Offset
	})
	return m
}

type topicPartition struct {
	topic     string
	partition int32
}

// Read implements Source: partitions are read concurrently by one client,
// each in offset order.
func (s *kafkaSource) Read(ctx context.Context, fn func(Letter) error) error {
	fn = dedupe(fn)
	return readPartitions(ctx, s.opts, s.start, s.end, func(r *kgo.Record) error {
		return fn(FromRecord(r))
	})
}

// readPartitions consumes every partition in end from its start offset
// (0 when absent) up to, not including, its end offset, then returns.
// Control records are skipped (they are kept from the client so that a
// partition ending in a transaction marker still reaches its end).
func readPartitions(ctx context.Context, opts []kgo.Opt, start, end map[string]map[int32]int64,
	fn func(*kgo.Record) error,
) error {
	remaining := make(map[topicPartition]int64)
	consume := make(map[string]map[int32]kgo.Offset)
	for t, ps := range end {
		for p, e := range ps {
			from := start[t][p]
			if from >= e {
				continue
			}
			remaining[topicPartition{t, p}] = e
			if consume[t] == nil {
				consume[t] = make(map[int32]kgo.Offset)
			}
			consume[t][p] = kgo.NewOffset().At(from)
		}
	}
	if len(remaining) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append(withoutConsuming(opts),
		kgo.ConsumePartitions(consume),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return fmt.Errorf("deadletter: %w", err)
	}
	defer cl.Close()

	for len(remaining) > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			sort.Slice(errs, func(i, j int) bool { return errs[i].Partition < errs[j].Partition })
			e := errs[0]
			return fmt.Errorf("deadletter: reading %s[%d]: %w", e.Topic, e.Partition, e.Err)
		}
		var ferr error
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			k := topicPartition{p.Topic, p.Partition}
			for _, r := range p.Records {
				e, ok := remaining[k]
				if ferr != nil || !ok {
					return
				}
				if r.Offset >= e {
					delete(remaining, k)
					return
				}
				if !r.Attrs.IsControl() {
					if ferr = fn(r); ferr != nil {
						return
					}
				}
				if r.Offset+1 >= e {
					delete(remaining, k)
				}
			}
		})
		if ferr != nil {
			return ferr
		}
	}
	return nil
}

// withoutConsuming drops the options that configure consuming (a group,
// topics to consume), so that a client built from another client's options
// only does what it is built for.
func withoutConsuming(opts []kgo.Opt) []kgo.Opt {
	var out []kgo.Opt
	for _, o := range opts {
		_, consumer := o.(kgo.ConsumerOpt)
		_, group := o.(kgo.GroupOpt)
		if !consumer && !group {
			out = append(out, o)
		}
	}
	return out
}
