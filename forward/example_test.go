package forward_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/internal/testkit"
)

// A forward.Handler is a kpar.Handler: every record is POSTed to the URL,
// and the response decides its outcome (2xx done, 429 and 5xx retried,
// other 4xx dead-lettered).
func Example() {
	// An in-process broker with topic "orders" holding a, b and c.
	cluster := testkit.ExampleCluster([]string{"orders"}, kgo.StringRecord("a"), kgo.StringRecord("b"), kgo.StringRecord("c"))
	defer cluster.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu   sync.Mutex
		got  []string
		once = map[string]bool{}
	)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body [16]byte
		n, _ := r.Body.Read(body[:])
		mu.Lock()
		defer mu.Unlock()
		v := string(body[:n])
		if v == "b" && !once[v] {
			once[v] = true
			w.WriteHeader(http.StatusServiceUnavailable) // retried by kpar
			return
		}
		got = append(got, v+" from "+r.Header.Get("Kpar-Topic"))
		if len(got) == 3 {
			cancel()
		}
	}))
	defer endpoint.Close()

	h, err := forward.New(endpoint.URL, forward.Timeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	c, err := kpar.New(h,
		kpar.Brokers(cluster.ListenAddrs()...),
		kpar.Group("forwarder"),
		kpar.Topics("orders"),
		kpar.RetryBackoff(time.Millisecond, 10*time.Millisecond),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
	sort.Strings(got)
	for _, g := range got {
		fmt.Println(g)
	}
	// Output:
	// a from orders
	// b from orders
	// c from orders
}
