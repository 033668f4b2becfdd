package pgsink

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/internal/testkit"
)

// TestOutageHoldsTheWindow: while PostgreSQL is unreachable, a poison
// record stays unfinished and no commit passes it; once the server is
// back, the letter is stored once and the window moves on.
func TestOutageHoldsTheWindow(t *testing.T) {
	dsn := postgresDSN(t)
	ctx := testCtx(t)
	sink, proxy, table := proxiedSink(ctx, t, dsn, false)

	const n, poison = 50, 5
	c := testkit.Cluster(t, kfake.SeedTopics(1, "pgout"), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "pgout", Value: []byte{byte(i)}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cl.Close()

	w := &watch{failed: make(chan struct{}, 100), done: make(chan struct{})}
	cons, err := kpar.New(kpar.HandlerFunc(func(_ context.Context, r *kgo.Record) error {
		if r.Offset == poison {
			return kpar.Permanent(errors.New("poison"))
		}
		return nil
	}), kpar.Brokers(c.ListenAddrs()...), kpar.Group("g"), kpar.Topics("pgout"),
		kpar.Ordering(kpar.Unordered), kpar.CommitInterval(50*time.Millisecond),
		kpar.RetryBackoff(10*time.Millisecond, 50*time.Millisecond),
		kpar.DeadLetters(sink), kpar.WithHooks(w))
	if err != nil {
		t.Fatal(err)
	}
	stop := testkit.Start(t, "Run", cons.Run)

	for range 2 { // the proxy starts down: PostgreSQL is unreachable
		select {
		case <-w.failed:
		case <-ctx.Done():
			t.Fatal("the PostgreSQL outage was never hit")
		}
	}
	if during := w.committed(); during > poison {
		t.Fatalf("committed %d while PostgreSQL was down, past the unfinished offset %d", during, poison)
	}
	proxy.setUp(true)
	select {
	case <-w.done:
	case <-ctx.Done():
		t.Fatal("the commit never passed the poison record after PostgreSQL came back")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	src, err := OpenSource(withTable(dsn, table))
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	if err := src.Read(ctx, func(l deadletter.Letter) error { got = append(got, l.Record.Offset); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != poison {
		t.Fatalf("dead letters after the outage: offsets %v, want [%d]", got, poison)
	}
}

// watch is a hook that sees failed sink writes and the highest commit.
type watch struct {
	failed chan struct{}
	done   chan struct{} // closed once the commit reaches the end

	mu        sync.Mutex
	maxCommit int64
}

func (w *watch) OnCommit(offs map[string]map[int32]int64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if o, ok := offs["pgout"][0]; ok && err == nil && o > w.maxCommit {
		if w.maxCommit = o; o >= 50 {
			close(w.done)
		}
	}
}

func (w *watch) OnDeadLetterFailed(int, error) {
	select {
	case w.failed <- struct{}{}:
	default:
	}
}

func (w *watch) committed() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxCommit
}

// switchProxy forwards TCP connections to target while up; while down it
// refuses new connections and cuts the open ones, like a stopped server.
type switchProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	up     bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

// proxiedSink makes a sink on a table of its own that reaches dsn's
// server through a proxy the test switches off and on (up or not at
// first). Connections time out after a second, so an outage is felt fast.
func proxiedSink(ctx context.Context, t *testing.T, dsn string, up bool) (*Sink, *switchProxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newSwitchProxy(t, u.Host)
	proxy.setUp(up)
	u.Host = proxy.ln.Addr().String()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	table := uniqueTable(t, dsn)
	// New, not Open: Open insists on reaching the server, which may be
	// down here.
	sink, err := New(ctx, lazyPool(t, u.String()), Table(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Close)
	return sink, proxy, table
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(func() { ln.Close(); p.setUp(false); p.wg.Wait() })
	return p
}

func (p *switchProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		up := p.up
		p.mu.Unlock()
		if !up {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { io.Copy(s, c); s.Close() })
		p.wg.Go(func() { io.Copy(c, s); c.Close() })
	}
}

func (p *switchProxy) setUp(up bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up = up
	if !up {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}
