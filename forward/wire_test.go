package forward

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// writeCounter is a net.Conn that counts its Write calls.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// A request goes to the endpoint in one write, its headers and its body
// together: net/http flushes the headers on their own (a second write for
// the client, a second read for the endpoint) before a body of a type it
// does not know to be in memory.
func TestForwardSendsHeadersAndBodyInOneWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Opt
	}{
		{"per record", nil},
		{"batch", []Opt{Batch(2, time.Millisecond)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, got := recorder(t, http.StatusOK)
			var writes atomic.Int64
			tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return writeCounter{c, &writes}, nil
			}}
			defer tr.CloseIdleConnections()
			h := newHandler(t, srv.URL, append([]Opt{Client(&http.Client{Transport: tr})}, tc.opts...)...)
			r := &kgo.Record{Topic: "t", Key: []byte("k"), Value: []byte(`{"a":1}`)}
			if err := h.Handle(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			if c := <-got; len(c.body) == 0 {
				t.Fatal("the endpoint got an empty body")
			}
			if n := writes.Load(); n != 1 {
				t.Errorf("the request took %d writes, want 1 (headers and body together)", n)
			}
		})
	}
}
