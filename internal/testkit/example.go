package testkit

import (
	"log"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ExampleCluster starts an in-process broker with topics of four partitions
// each and produces records to it (to the first topic, unless a record
// names its own): the setup of the Example functions of every module, so
// that their bodies show only kpar. An example has no testing.T, so an
// error ends the program as log.Fatal does in the examples themselves. The
// caller closes the cluster.
func ExampleCluster(topics []string, records ...*kgo.Record) *kfake.Cluster {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topics...))
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range records {
		if r.Topic == "" {
			r.Topic = topics[0]
		}
	}
	if _, err := produceSync(cluster.ListenAddrs(), records); err != nil {
		log.Fatal(err)
	}
	return cluster
}
