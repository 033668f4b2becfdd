package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/kpar/kpar/cmd/kpar/internal/embedded"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// broker is the one kfake broker every contender of a run consumes from,
// with an admin client that loads topics and watches groups.
//
// With Config.SpawnBroker the broker runs in a child process instead
// (brokerchild.go): kc is nil and child drives its gate.
type broker struct {
	kc    *embedded.Cluster
	child *brokerChild
	addr  string
	cl    *kgo.Client // loads records (pinned to produce v9: names, not topic IDs)
	adm   *kadm.Client
}

func startBroker(spawn func() *exec.Cmd) (*broker, error) {
	b := &broker{}
	if spawn != nil {
		child, addr, err := startBrokerChild(spawn())
		if err != nil {
			return nil, err
		}
		b.child, b.addr = child, addr
	} else {
		kc, err := embedded.Start(embedded.Config{})
		if err != nil {
			return nil, fmt.Errorf("starting the broker: %w", err)
		}
		b.kc, b.addr = kc, kc.Addr()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addr), kgo.MaxVersions(kversion.V3_0_0()))
	if err != nil {
		b.closeBroker()
		return nil, err
	}
	b.cl, b.adm = cl, kadm.NewClient(cl)
	return b, nil
}

func (b *broker) close() {
	b.cl.Close()
	b.closeBroker()
}

func (b *broker) closeBroker() {
	if b.child != nil {
		b.child.close()
	} else {
		b.kc.Close()
	}
}

// topic is a loaded topic: what is in it, so runs know when they are done.
type topic struct {
	name       string
	partitions int
	keys       int // distinct keys; 0 for nil keys
	valueBytes int // bytes per value
	// gen, when set, makes record i's value (appended to buf) instead
	// of the decimal i padded to valueBytes.
	gen   func(i int64, buf []byte) []byte
	ends  []int64 // records per partition (offsets start at 0)
	total int64
}

func (b *broker) createTopic(ctx context.Context, name string, partitions, keys, valueBytes int) (*topic, error) {
	resp, err := b.adm.CreateTopic(ctx, int32(partitions), 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return nil, fmt.Errorf("creating topic %s: %w", name, err)
	}
	return &topic{name: name, partitions: partitions, keys: keys, valueBytes: valueBytes, ends: make([]int64, partitions)}, nil
}

// keyOf is record i's key: one of t.keys keys, or nil.
func (t *topic) keyOf(i int64, buf []byte) []byte {
	if t.keys == 0 {
		return nil
	}
	return strconv.AppendInt(append(buf[:0], 'k'), i%int64(t.keys), 10)
}

// partitionOf places a keyed record by the hash of its key, as Kafka's
// partitioners do (so a key lives in one partition), and an unkeyed one
// round-robin.
func (t *topic) partitionOf(i int64, key []byte) int {
	if key == nil {
		return int(i % int64(t.partitions))
	}
	h := uint32(2166136261) // FNV-1a
	for _, c := range key {
		h = (h ^ uint32(c)) * 16777619
	}
	return int(h % uint32(t.partitions))
}

// load appends n more records to t: record i gets key keyOf(i) and a value
// of valueBytes bytes that starts with i. It builds record batches itself
// and sends them in large produce requests, about ten times faster than a
// producer client, so a 10^7 backlog takes seconds.
func (b *broker) load(ctx context.Context, t *topic, n int64) error {
	l := &loader{b: b, t: t, parts: make([]pendingBatch, t.partitions), req: kmsg.NewPtrProduceRequest(), ts: time.Now().UnixMilli()}
	l.req.Acks = -1
	l.req.TimeoutMillis = 30000
	var (
		key   []byte
		value = make([]byte, t.valueBytes)
		num   [20]byte
	)
	start := t.total // seal moves t.total
	for i := start; i < start+n; i++ {
		key = t.keyOf(i, key)
		p := t.partitionOf(i, key)
		if t.gen != nil {
			value = t.gen(i, value[:0])
		} else {
			copy(value, strconv.AppendInt(num[:0], i, 10))
		}
		pp := &l.parts[p]
		pp.recs = appendRecord(pp.recs, pp.n, key, value)
		pp.n++
		if pp.n >= loadBatchRecords || len(pp.recs) >= loadBatchBytes {
			if err := l.seal(ctx, p); err != nil {
				return err
			}
		}
	}
	for p := range l.parts {
		if err := l.seal(ctx, p); err != nil {
			return err
		}
	}
	return l.send(ctx)
}

// The loader's batch and request sizes.
const (
	loadBatchRecords = 4096
	loadBatchBytes   = 256 << 10
	loadRequestBytes = 4 << 20
)

// loader is one load of a topic: the records of each partition not yet
// sealed into a batch, and the produce request the sealed batches fill.
type loader struct {
	b       *broker
	t       *topic
	parts   []pendingBatch
	req     *kmsg.ProduceRequest
	reqSize int
	ts      int64 // every record's timestamp
}

// pendingBatch is a partition's records not yet in a batch.
type pendingBatch struct {
	recs []byte
	n    int32
}

// send sends the request, if it holds any batch.
func (l *loader) send(ctx context.Context) error {
	if len(l.req.Topics) == 0 {
		return nil
	}
	resp, err := l.req.RequestWith(ctx, l.b.cl)
	if err != nil {
		return fmt.Errorf("loading %s: %w", l.t.name, err)
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return fmt.Errorf("loading %s/%d: %w", l.t.name, rp.Partition, err)
			}
		}
	}
	l.req.Topics, l.reqSize = nil, 0
	return nil
}

// seal makes partition p's pending records a batch of the request, and
// sends the request once it is large enough.
func (l *loader) seal(ctx context.Context, p int) error {
	pp := &l.parts[p]
	if pp.n == 0 {
		return nil
	}
	rb := kmsg.RecordBatch{
		PartitionLeaderEpoch: -1,
		Magic:                2,
		LastOffsetDelta:      pp.n - 1,
		FirstTimestamp:       l.ts,
		MaxTimestamp:         l.ts,
		ProducerID:           -1,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           pp.n,
		Records:              pp.recs,
	}
	raw := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:12], uint32(len(raw)-12))
	binary.BigEndian.PutUint32(raw[17:21], crc32.Checksum(raw[21:], castagnoli))
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = l.t.name
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition = int32(p)
	rp.Records = raw
	rt.Partitions = append(rt.Partitions, rp)
	l.req.Topics = append(l.req.Topics, rt)
	l.reqSize += len(raw)
	l.t.ends[p] += int64(pp.n)
	l.t.total += int64(pp.n)
	pp.recs, pp.n = nil, 0
	if l.reqSize >= loadRequestBytes {
		return l.send(ctx)
	}
	return nil
}

// warm reads t once from start to end outside any group, so that the first
// measured run does not pay for what the broker and this process do on a
// topic's first read (the first run was several times slower than the same
// run repeated).
func (b *broker) warm(ctx context.Context, t *topic) error {
	offsets := map[int32]kgo.Offset{}
	for p := range t.partitions {
		offsets[int32(p)] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addr), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{t.name: offsets}))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for n := int64(0); n < t.total; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("warming %s: %w", t.name, err)
		}
		n += int64(fs.NumRecords())
	}
	return nil
}

// appendRecord appends one v2 record (no headers, timestamp delta 0).
func appendRecord(dst []byte, offsetDelta int32, key, value []byte) []byte {
	var body [32]byte
	b := append(body[:0], 0) // attributes
	b = binary.AppendVarint(b, 0)
	b = binary.AppendVarint(b, int64(offsetDelta))
	if key == nil {
		b = binary.AppendVarint(b, -1)
	} else {
		b = binary.AppendVarint(b, int64(len(key)))
	}
	tail := binary.AppendVarint(nil, int64(len(value)))
	length := len(b) + len(key) + len(tail) + len(value) + 1 // +1: header count
	dst = binary.AppendVarint(dst, int64(length))
	dst = append(dst, b...)
	dst = append(dst, key...)
	dst = append(dst, tail...)
	dst = append(dst, value...)
	return binary.AppendVarint(dst, 0)
}

// gate holds every fetch at the broker until it opens, so that a contender
// can join its group (and, with several members, finish rebalancing) before
// the clock starts: what is measured is consumption, not group formation.
//
// It holds share-group fetches (ShareFetch) too, and tells when the first
// of each kind arrived: contenders without a consumer group (share.go)
// have settled then.
type gate struct {
	once sync.Once
	ch   chan struct{}
	// onOpen tells a child broker (brokerChild.closeGate); openErr is
	// its error.
	onOpen  func() error
	openErr error

	fetched, shareFetched     chan struct{} // closed at the first held Fetch, ShareFetch
	fetchOnce, shareFetchOnce sync.Once
}

func (b *broker) closeGate() (*gate, error) {
	g := &gate{ch: make(chan struct{}), fetched: make(chan struct{}), shareFetched: make(chan struct{})}
	if b.child != nil {
		return g, b.child.closeGate(g)
	}
	holdFetches(b.kc, g.ch, g.saw)
	return g, nil
}

// holdFetches makes kc hold every Fetch and ShareFetch until open is
// closed, calling seen with the request's key at the first one held of
// each kind; the in-process gate and the child broker (ServeBroker) share
// it.
func holdFetches(kc *embedded.Cluster, open <-chan struct{}, seen func(key int16)) {
	for _, key := range []int16{int16(kmsg.Fetch), int16(kmsg.ShareFetch)} {
		var first sync.Once
		kc.ControlKey(key, func(kmsg.Request) (kmsg.Response, error, bool) {
			select {
			case <-open:
				kc.DropControl()
			default:
				first.Do(func() { seen(key) })
				kc.SleepControl(func() { <-open })
			}
			return nil, nil, false // then kfake answers the fetch as usual
		})
	}
}

// saw tells g that the first fetch of kind key was held.
func (g *gate) saw(key int16) {
	if key == int16(kmsg.ShareFetch) {
		g.shareFetchOnce.Do(func() { close(g.shareFetched) })
	} else {
		g.fetchOnce.Do(func() { close(g.fetched) })
	}
}

// open opens g once; a child broker's error stays in openErr.
func (g *gate) open() {
	g.once.Do(func() {
		close(g.ch)
		if g.onOpen != nil {
			g.openErr = g.onOpen()
		}
	})
}

// waitStable waits until group has members members and all of the topic's
// partitions are assigned, with no rebalance in progress.
func (b *broker) waitStable(ctx context.Context, group string, members int, t *topic, stop <-chan error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("group %s did not settle: %w", group, ctx.Err())
		case err := <-stop:
			return fmt.Errorf("the contender stopped before its group settled: %v", err)
		case <-tick.C:
		}
		gs, err := b.adm.DescribeGroups(ctx, group)
		if err != nil {
			continue
		}
		g, ok := gs[group]
		if !ok || g.Err != nil || g.State != "Stable" || len(g.Members) != members {
			continue
		}
		assigned := 0
		for _, m := range g.Members {
			if ca, ok := m.Assigned.AsConsumer(); ok {
				for _, at := range ca.Topics {
					if at.Topic == t.name {
						assigned += len(at.Partitions)
					}
				}
			}
		}
		if assigned == t.partitions {
			return nil
		}
	}
}

// committed sums the group's committed offsets on t and reports whether
// every partition's commit reached its end.
func (b *broker) committed(ctx context.Context, group string, t *topic) (sum int64, atEnd bool, err error) {
	os, err := b.adm.FetchOffsets(ctx, group)
	if err != nil {
		return 0, false, err
	}
	atEnd = true
	for p := range t.partitions {
		o, ok := os.Lookup(t.name, int32(p))
		if !ok || o.Err != nil || o.At < 0 {
			atEnd = false
			continue
		}
		sum += o.At
		if o.At < t.ends[p] {
			atEnd = false
		}
	}
	return sum, atEnd, nil
}

// crashPoint simulates a kill of a group's consumer at a commit. Until
// armed, the group's commits pass. The first commit after arming reaches
// the broker and is applied, and at that instant the consumer counts as
// killed: kill runs (the tracker stops counting completions). Every commit
// of the group after it is refused, so nothing the dying consumer does
// afterwards is durable. restart lets commits through again.
type crashPoint struct {
	armed  atomic.Bool
	killed chan struct{}
	state  atomic.Int32 // 0 running, 1 killed, 2 restarted
}

func (b *broker) crashAtCommit(group string, kill func()) *crashPoint {
	cp := &crashPoint{killed: make(chan struct{})}
	b.kc.ControlKey(int16(kmsg.OffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		if cp.state.Load() == 2 {
			b.kc.DropControl()
			return nil, nil, false
		}
		req := kr.(*kmsg.OffsetCommitRequest)
		if req.Group != group {
			return nil, nil, false
		}
		switch cp.state.Load() {
		case 0:
			if cp.armed.Load() {
				cp.state.Store(1)
				kill()
				close(cp.killed)
			}
			return nil, nil, false
		case 1:
			b.kc.KeepControl()
			return refuseCommit(req), nil, true
		default:
			return nil, nil, false
		}
	})
	return cp
}

func (cp *crashPoint) restart() { cp.state.Store(2) }

// refuseCommit answers req with an error on every partition, so that none
// of it is applied: the commit of a consumer that counts as dead.
func refuseCommit(req *kmsg.OffsetCommitRequest) *kmsg.OffsetCommitResponse {
	resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewOffsetCommitResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewOffsetCommitResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = kerr.InvalidCommitOffsetSize.Code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// commitWatch counts the OffsetCommit requests of one group as the broker
// receives them, with their size at the version they were sent with, and
// refuses those of the members it was told are dead (commits scenario).
type commitWatch struct {
	group     string
	requests  atomic.Int64
	wireBytes atomic.Int64
	stopped   atomic.Bool

	mu   sync.Mutex      // guards dead
	dead map[string]bool // member IDs whose commits are refused
}

func (b *broker) watchCommits(group string) *commitWatch {
	w := &commitWatch{group: group, dead: map[string]bool{}}
	b.kc.ControlKey(int16(kmsg.OffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		if w.stopped.Load() {
			b.kc.DropControl()
			return nil, nil, false
		}
		req := kr.(*kmsg.OffsetCommitRequest)
		if req.Group != w.group {
			return nil, nil, false // not handled: the control stays
		}
		w.requests.Add(1)
		w.wireBytes.Add(int64(len(req.AppendTo(nil))))
		w.mu.Lock()
		dead := w.dead[req.MemberID]
		w.mu.Unlock()
		if !dead {
			return nil, nil, false
		}
		b.kc.KeepControl()
		return refuseCommit(req), nil, true
	})
	return w
}

// kill refuses every later commit of member.
func (w *commitWatch) kill(member string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dead[member] = true
}

// stop drops the watch at the next commit any group sends.
func (w *commitWatch) stop() { w.stopped.Store(true) }
