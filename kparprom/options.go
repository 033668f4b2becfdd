package kparprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/plugin/kprom"
)

// RegistererGatherer is a registry that metrics are both added to and
// gathered from, such as *prometheus.Registry.
type RegistererGatherer interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// Opt configures Metrics. Options are applied in order; later ones win.
type Opt interface{ apply(*cfg) }

type opt func(*cfg)

func (o opt) apply(c *cfg) { o(c) }

type cfg struct {
	namespace         string
	reg               RegistererGatherer
	latencyBuckets    []float64
	recentDeadLetters int
	endOffsetsTimeout time.Duration
	clientOpts        []kprom.Opt
}

// DefLatencyBuckets are the default buckets, in seconds, of the handler
// latency histogram: half a millisecond to a minute, for handlers from an
// in-memory update to a slow HTTP call with retries.
var DefLatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func defaultCfg() cfg {
	return cfg{
		namespace:         "kpar",
		latencyBuckets:    DefLatencyBuckets,
		recentDeadLetters: 50,
		endOffsetsTimeout: time.Second,
	}
}

// Namespace sets the prefix of every metric name, overriding the default
// "kpar". The client's own metrics (see Metrics.ClientOpts) are named
// <namespace>_client_*.
func Namespace(ns string) Opt { return opt(func(c *cfg) { c.namespace = ns }) }

// Registry sets the registry the metrics are added to and gathered from,
// overriding the default of a new registry of their own.
func Registry(rg RegistererGatherer) Opt { return opt(func(c *cfg) { c.reg = rg }) }

// LatencyBuckets sets the buckets, in seconds, of the handler latency
// histogram, overriding DefLatencyBuckets.
func LatencyBuckets(buckets ...float64) Opt {
	return opt(func(c *cfg) { c.latencyBuckets = append([]float64(nil), buckets...) })
}

// RecentDeadLetters sets how many of the latest dead letters
// Metrics.RecentDeadLetters keeps, overriding the default 50. Zero keeps
// none.
func RecentDeadLetters(n int) Opt { return opt(func(c *cfg) { c.recentDeadLetters = max(n, 0) }) }

// EndOffsetsTimeout bounds how long a scrape waits for the brokers to list
// the high watermarks that commit lag is computed from, overriding the
// default 1s. On timeout the scrape reports the last watermarks it knew.
func EndOffsetsTimeout(d time.Duration) Opt {
	return opt(func(c *cfg) {
		if d > 0 {
			c.endOffsetsTimeout = d
		}
	})
}

// ClientMetrics adds options for franz-go's kprom plugin, which measures the
// client's own connections, requests and fetches (for example
// kprom.FetchAndProduceDetail or kprom.Histograms). kparprom already sets
// the namespace, the "client" subsystem and the registry.
func ClientMetrics(opts ...kprom.Opt) Opt {
	return opt(func(c *cfg) { c.clientOpts = append(c.clientOpts, opts...) })
}
