package main

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
)

// defaultMetadataMaxAge is --metadata-max-age's default: how often kpar
// forward refreshes its cluster metadata when nothing else made it. A
// classic group notices partitions added to a topic (kafka-topics --alter
// --partitions) and, with --topic-regex, new topics only through its
// leader's metadata: with franz-go's (and Kafka's) default of 5 minutes,
// records produced to a new partition waited up to 5 minutes, unconsumed
// and unseen by /readyz (measured: 4,010 records). The consumer protocol
// learns them from the broker at the next heartbeat. One Metadata request
// of the consumed topics every 10s per member is little for a broker, and
// bounds the wait to about 10s plus a rebalance.
const defaultMetadataMaxAge = 10 * time.Second

// addMetadataMaxAge defines --metadata-max-age on fs.
func addMetadataMaxAge(fs *flagSet) *time.Duration {
	return fs.Duration("metadata-max-age", defaultMetadataMaxAge, "refresh the cluster metadata at least this often: a classic group consumes partitions added to its topics (and, with --topic-regex, new topics) within about this long (franz-go's and Kafka's default is 5m); 1s to 1h")
}

// checkMetadataMaxAge returns the usage error of an age out of range.
func checkMetadataMaxAge(fs *flagSet, age time.Duration) (code int, ok bool) {
	if age < time.Second || age > time.Hour {
		return fs.usageError("invalid --metadata-max-age %v: want 1s to 1h", age), false
	}
	return 0, true
}

// metadataOpts are the client options of --metadata-max-age. franz-go
// refreshes no more often than its min age, 5s by default: a shorter max
// age lowers it too.
func metadataOpts(age time.Duration) []kpar.ConsumerOpt {
	return []kpar.ConsumerOpt{kpar.ClientOptions(kgo.MetadataMaxAge(age), kgo.MetadataMinAge(min(age, 5*time.Second)))}
}
