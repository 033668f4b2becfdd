package testkit

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Producer produces keyed records (key "k<i mod keys>", value "<i>") at a
// steady rate until stopped, so that production goes on while a chaos test
// does its damage. Each acknowledged record is passed to the onAck of
// StartProducer (a ledger's Produced, say).
type Producer struct {
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
	// Started is closed on the first acknowledgement: the topic exists.
	Started   chan struct{}
	startOnce sync.Once
	acked     atomic.Int64
	failed    atomic.Int64
	first     atomic.Value // the first produce error
	once      sync.Once    // Stop runs once: by the test, else at cleanup
}

// StartProducer produces perSecond records a second to topic on brokers
// (created on first use), in ticks of 10 ms, until Stop or the end of the
// test.
func StartProducer(ctx context.Context, t testing.TB, brokers []string, topic string, perSecond, keys int, onAck func(*kgo.Record)) *Producer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation(),
		kgo.ProducerLinger(time.Millisecond), kgo.RecordRetries(1000), kgo.RecordDeliveryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Producer{cl: cl, cancel: cancel, done: make(chan struct{}), Started: make(chan struct{})}
	go func() {
		defer close(p.done)
		const tick = 10 * time.Millisecond
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		per := max(1, perSecond*int(tick)/int(time.Second))
		for i := 0; ; {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			for range per {
				r := &kgo.Record{Key: fmt.Appendf(nil, "k%03d", i%keys), Value: []byte(strconv.Itoa(i))}
				i++
				cl.Produce(context.WithoutCancel(ctx), r, func(r *kgo.Record, err error) {
					if err != nil {
						p.failed.Add(1)
						p.first.CompareAndSwap(nil, err)
						return
					}
					onAck(r)
					p.acked.Add(1)
					p.startOnce.Do(func() { close(p.Started) })
				})
			}
		}
	}()
	t.Cleanup(func() { p.Stop(t) })
	return p
}

// Stop ends production, waits for every acknowledgement (failing the test
// on a record that could not be produced) and returns how many records
// were acknowledged.
func (p *Producer) Stop(t testing.TB) int64 {
	t.Helper()
	p.once.Do(func() {
		p.cancel()
		<-p.done
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.cl.Flush(ctx); err != nil {
			t.Errorf("flushing the producer: %v", err)
		}
		p.cl.Close()
		if n := p.failed.Load(); n > 0 {
			t.Errorf("%d records not produced; first error: %v", n, p.first.Load())
		}
	})
	return p.acked.Load()
}

// Produce produces records to brokers and waits for every acknowledgement,
// failing the test on an error. The results hold the records as
// acknowledged (partition and offset set), for a ledger's Produced.
func Produce(t testing.TB, brokers []string, records ...*kgo.Record) kgo.ProduceResults {
	t.Helper()
	res, err := produceSync(brokers, records)
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	return res
}

// produceSync produces records to brokers, waiting up to a minute for
// their acknowledgements.
func produceSync(brokers []string, records []*kgo.Record) (kgo.ProduceResults, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := cl.ProduceSync(ctx, records...)
	return res, res.FirstErr()
}
