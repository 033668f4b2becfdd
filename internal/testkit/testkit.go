// Package testkit holds the test helpers that kpar's packages and modules
// share (the root, deadletter, pgsink, kparprom, cmd/kpar): bounded
// contexts, an in-process broker, a background runner with a bounded stop,
// and the environment switches of the suites. Only tests import it.
package testkit

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Context is a context that ends after d or when the test ends: every wait
// of a test is on a context, never on a sleep.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Cluster starts an in-process kfake broker (one broker, then opts),
// closed when the test ends.
func Cluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// ClosedPort is a loopback address nothing listens on.
func ClosedPort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// PostgresDSN is KPAR_TEST_POSTGRES, or the test is skipped.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("KPAR_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("KPAR_TEST_POSTGRES is unset: set it to a PostgreSQL DSN (scripts/test.sh starts a server and sets it)")
	}
	return dsn
}

// Start runs run in the background until the test ends or stop is called;
// stop cancels run's context and returns its error, failing the test if
// run does not return within 30 s of the cancel. what names run in that
// failure.
func Start(t testing.TB, what string, run func(context.Context) error) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var (
		once sync.Once
		err  error
	)
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not return within 30s of cancel", what)
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}
