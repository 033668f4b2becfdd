package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/kpar/kpar/cmd/kpar/internal/embedded"
)

// addBrokerRegistryFlag defines kpar broker's --schema-registry.
func addBrokerRegistryFlag(fs *flagSet) *string {
	return fs.String("schema-registry", "", "also serve an in-memory Schema Registry (franz-go's srfake: the Confluent REST API) on loopback `host:port` (port 0: a free one), for typed records in development; it prints \"kpar broker schema registry listening on http://ADDR\"")
}

// serveRegistry serves srfake on addr until stop is called.
func serveRegistry(addr string, stdout io.Writer) (stop func(), err error) {
	a, err := embedded.ListenAddr(addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", a)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: srfake.NewRegistry().Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stdout, "kpar broker: schema registry stopped: %v\n", err)
		}
	}()
	fmt.Fprintf(stdout, "kpar broker schema registry listening on http://%s\n", ln.Addr())
	return func() {
		_ = srv.Close()
		<-done
	}, nil
}
