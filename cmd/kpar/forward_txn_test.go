package main

import (
	"context"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar/internal/testkit"
)

// leaveTxnOpen does what a forwarder killed mid-transaction leaves behind:
// an open transaction of txnID with an output and a commit of group's
// offset of topic/0. The broker answers the group's offset fetches
// UNSTABLE_OFFSET_COMMIT until it ends (KIP-447).
func leaveTxnOpen(ctx context.Context, t *testing.T, addr, txnID, group, topic string, timeout time.Duration) {
	t.Helper()
	cl := newClient(t, addr, kgo.TransactionalID(txnID), kgo.TransactionTimeout(timeout), kgo.DefaultProduceTopic(topic+".out"), kgo.AllowAutoTopicCreation())
	t.Cleanup(cl.Close) // the dead forwarder: it never ends its transaction
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("the dead forwarder's reply")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txnID, id, epoch, group
	if resp, err := add.RequestWith(ctx, cl); err != nil || resp.ErrorCode != 0 {
		t.Fatalf("AddOffsetsToTxn: %v, %v", err, kerr.ErrorForCode(resp.ErrorCode))
	}
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	metaResp, err := meta.RequestWith(ctx, cl)
	if err != nil || len(metaResp.Topics) != 1 {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch, req.Generation = txnID, group, id, epoch, -1
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = topic, metaResp.Topics[0].TopicID
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.LeaderEpoch = 0, 1, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && (len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1) {
		t.Fatalf("TxnOffsetCommit: %d topics in the response", len(resp.Topics))
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].Partitions[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("TxnOffsetCommit: %v", err)
	}
}

// TestForwardExactlyOnceRestartDoesNotWaitForTheDeadTransaction: `kpar
// forward --exactly-once --instance-id i1` started where a forwarder of the
// same ID was killed mid-transaction delivers at once, logging what it
// does: it waited out the dead transaction's timeout (40s, franz-go's
// default), silently (1 restart in 60 in the probe). Its transactions are
// opened with --transaction-timeout: 10s by default.
func TestForwardExactlyOnceRestartDoesNotWaitForTheDeadTransaction(t *testing.T) {
	t.Parallel()
	bin, ctx := e2e(t, 2*time.Minute)
	c := testkit.Cluster(t, kfake.SeedTopics(1, "orders"), kfake.AllowAutoTopicCreation())
	addr := c.ListenAddrs()[0]
	var mu sync.Mutex
	timeouts := map[string]int32{} // transactional ID -> the TransactionTimeoutMillis of its last InitProducerID
	c.ControlKey(int16(kmsg.InitProducerID), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.InitProducerIDRequest)
		if req.TransactionalID != nil {
			mu.Lock()
			timeouts[*req.TransactionalID] = req.TransactionTimeoutMillis
			mu.Unlock()
		}
		return nil, nil, false
	})
	const n = 20
	produceIndexed(ctx, t, "orders", n, 4, kgo.SeedBrokers(addr))
	leaveTxnOpen(ctx, t, addr, "eos-i1", "eos", "orders", time.Minute)

	ep := newEndpoint(t, func(int, int) reply { return reply{} })
	start := time.Now()
	p := startForward(ctx, t, bin, nil, "--brokers", addr, "--group", "eos", "--topic", "orders", "--url", ep.srv.URL,
		"--exactly-once", "--instance-id", "i1", "--log-level", "info")
	// Well within the dead transaction's minute: the restart must not
	// wait for it.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ep.waitFor(wctx, t, p, "every record delivered", func() bool { return ep.delivered() == n })
	took := time.Since(start)
	for _, want := range []string{"initialising the transactional producer", "transactional_id=eos-i1", "transaction_timeout=10s", "transactional producer ready"} {
		if !p.stderr.wait(ctx, want, p.exited) {
			t.Errorf("the log does not say %q:\n%s", want, tail(p.stderr))
		}
	}
	if code := p.stop(ctx, t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, tail(p.stderr))
	}
	mu.Lock()
	got := timeouts["eos-i1"]
	mu.Unlock()
	if got != 10000 {
		t.Errorf("the forwarder initialised its transactions with a timeout of %dms, want 10000 (--transaction-timeout's default)", got)
	}
	t.Logf("the restarted forwarder delivered %d records %v after its start", n, took.Round(10*time.Millisecond))
}

// --transaction-timeout is refused without --exactly-once and outside 1s
// to 15m, in one line naming it.
func TestForwardTransactionTimeoutRejectsBadUse(t *testing.T) {
	base := []string{"--brokers", "127.0.0.1:9092", "--group", "g", "--topic", "t", "--url", "http://127.0.0.1:8080/in"}
	for name, extra := range map[string][]string{
		"without exactly-once": {"--transaction-timeout", "5s"},
		"too short":            {"--exactly-once", "--instance-id", "i", "--transaction-timeout", "500ms"},
		"too long":             {"--exactly-once", "--instance-id", "i", "--transaction-timeout", "1h"},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			if code := cmdForward(t.Context(), append(slices.Clone(base), extra...), &stdout, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if msg := stderr.String(); strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "--transaction-timeout") {
				t.Errorf("stderr = %q, want one line naming --transaction-timeout", msg)
			}
		})
	}
}
