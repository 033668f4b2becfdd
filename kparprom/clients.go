package kparprom

import (
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
)

// sharedClient gives franz-go's kprom metrics to every client a Consumer
// builds from its ClientOptions at once: the group's, the producer of
// kpar.Outputs and kpar.ExactlyOnce, a share group's admin client. kprom
// registers its collectors when a client is created (OnNewClient) and
// panics when they are registered already ("duplicate metrics collector
// registration attempted"), which is what `kpar forward --reply-topic
// --metrics-listen` did at start. Here the first client registers them and
// the last one to close unregisters them; in between the traffic of every
// client (connects, bytes, produce and fetch batches) is counted in the
// same series. The buffered-records gauges read the client that
// registered.
type sharedClient struct {
	k *kprom.Metrics

	mu   sync.Mutex // guards live; held across kprom's (un)registration
	live int        // clients created and not yet closed
}

var (
	_ kgo.HookNewClient           = new(sharedClient)
	_ kgo.HookClientClosed        = new(sharedClient)
	_ kgo.HookBrokerConnect       = new(sharedClient)
	_ kgo.HookBrokerDisconnect    = new(sharedClient)
	_ kgo.HookBrokerWrite         = new(sharedClient)
	_ kgo.HookBrokerRead          = new(sharedClient)
	_ kgo.HookProduceBatchWritten = new(sharedClient)
	_ kgo.HookFetchBatchRead      = new(sharedClient)
	_ kgo.HookBrokerE2E           = new(sharedClient)
	_ kgo.HookBrokerThrottle      = new(sharedClient)
)

// OnNewClient registers kprom's collectors for the first live client only.
// A client's other hooks run after its OnNewClient returned, so they see
// the collectors that the first client's call made.
func (s *sharedClient) OnNewClient(cl *kgo.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live == 0 {
		s.k.OnNewClient(cl)
	}
	s.live++
}

// OnClientClosed unregisters the collectors once no client is left.
func (s *sharedClient) OnClientClosed(cl *kgo.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live--
	if s.live == 0 {
		s.k.OnClientClosed(cl)
	}
}

func (s *sharedClient) OnBrokerConnect(meta kgo.BrokerMetadata, d time.Duration, c net.Conn, err error) {
	s.k.OnBrokerConnect(meta, d, c, err)
}

func (s *sharedClient) OnBrokerDisconnect(meta kgo.BrokerMetadata, c net.Conn) {
	s.k.OnBrokerDisconnect(meta, c)
}

func (s *sharedClient) OnBrokerWrite(meta kgo.BrokerMetadata, key int16, n int, wait, write time.Duration, err error) {
	s.k.OnBrokerWrite(meta, key, n, wait, write, err)
}

func (s *sharedClient) OnBrokerRead(meta kgo.BrokerMetadata, key int16, n int, wait, read time.Duration, err error) {
	s.k.OnBrokerRead(meta, key, n, wait, read, err)
}

func (s *sharedClient) OnProduceBatchWritten(meta kgo.BrokerMetadata, topic string, partition int32, m kgo.ProduceBatchMetrics) {
	s.k.OnProduceBatchWritten(meta, topic, partition, m)
}

func (s *sharedClient) OnFetchBatchRead(meta kgo.BrokerMetadata, topic string, partition int32, m kgo.FetchBatchMetrics) {
	s.k.OnFetchBatchRead(meta, topic, partition, m)
}

func (s *sharedClient) OnBrokerE2E(meta kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	s.k.OnBrokerE2E(meta, key, e2e)
}

func (s *sharedClient) OnBrokerThrottle(meta kgo.BrokerMetadata, interval time.Duration, after bool) {
	s.k.OnBrokerThrottle(meta, interval, after)
}
