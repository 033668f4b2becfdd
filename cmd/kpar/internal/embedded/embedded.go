// Package embedded starts franz-go's kfake as a single Kafka broker on a
// loopback address, for `kpar broker`, `kpar demo` and tests.
//
// The broker auto-creates topics on first use (a producer's metadata request),
// like a Kafka broker with auto.create.topics.enable, with Config.Partitions
// partitions each.
//
// # Persistence
//
// With Config.DataDir set, kfake keeps its state in that directory and loads
// it again on the next Start with the same directory:
//
//   - topics (topics.json) and their records (partitions/<topic>-<n>/*.dat,
//     one file write per produced batch);
//   - committed group offsets and group metadata (groups.log, one write per
//     commit), producer IDs and transactions (pids.log), ACLs, SASL users,
//     quotas and broker configs;
//   - on a clean Close only: per-partition snapshots (high watermark, log
//     start offset, leader epoch), idempotent-producer sequence windows and
//     the members of live groups (session_state.json).
//
// After a clean Close everything above is back on restart. After the process
// dies without Close (kill -9, a crash) topics, records and committed offsets
// written before the death are still there: kfake writes them as they happen
// and reloads by replaying the segment files, and the files are in the OS
// page cache even though nothing called fsync. What is lost is what kfake
// saves only on Close: group membership (consumers rejoin), the sequence
// windows that deduplicate an idempotent producer's retries across the kill,
// and the transactions in progress: kfake aborts those in memory but writes
// no ABORT marker, so read_committed readers then skip that producer's later
// transactions too (kpar broker writes the markers: cmd/kpar/broker_txn.go).
// A kill in the middle of a transaction's commit leaves it half committed;
// Start journals what the repair needs to complete it (txnjournal.go).
// Surviving a machine crash or power loss needs fsync on every write: pass
// kfake.SyncWrites() in Config.Opts.
//
// kfake itself writes topics.json when a topic is created by CreateTopics but
// not when a metadata request auto-creates it; only Close saves those. A
// topic auto-created since the last clean start would therefore vanish with
// its records on a kill -9, and recreating it later would append to its old
// segment files. With a DataDir, Start closes that gap by creating every
// topic a metadata request asks to auto-create through
// kfake.Cluster.CreateTopic first, which persists topics.json at once.
//
// Two brokers must never share a DataDir: nothing locks it.
package embedded

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Config configures Start. The zero value is a broker on a free port of
// 127.0.0.1 that keeps everything in memory.
type Config struct {
	// Addr is the loopback host:port to listen on, overriding the default
	// 127.0.0.1:0. Port 0 picks a free port; Cluster.Addr reports it.
	// The host must be localhost or a loopback IP (see ListenAddr).
	Addr string

	// Partitions is the partition count of auto-created topics, overriding
	// kfake's default of 10.
	Partitions int

	// DataDir, if not empty, is where the cluster keeps its state across
	// restarts; see the package documentation for what survives what.
	DataDir string

	// Opts are extra kfake options, applied after ours: for example
	// kfake.SeedTopics, kfake.GroupMinSessionTimeout, kfake.WithLogger or
	// kfake.SyncWrites. Do not pass NumBrokers, Ports or ListenFn: Start
	// runs exactly one broker on Addr.
	Opts []kfake.Opt
}

// Cluster is a running single-broker kfake cluster. The embedded
// *kfake.Cluster gives tests its controls and faults; Close stops it.
type Cluster struct {
	*kfake.Cluster
	addr string
}

// Addr returns the host:port the broker listens on, with the real port when
// Config.Addr asked for port 0.
func (c *Cluster) Addr() string { return c.addr }

// ListenAddr checks that addr is a loopback host:port and returns the
// address to listen on: localhost becomes 127.0.0.1, which is where kfake
// listens by default and what its metadata then advertises. An empty host
// (":9092") is rejected because it means every interface.
func ListenAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q is not host:port", addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("port %q of %q is not a number from 0 to 65535", port, addr)
	}
	switch ip := net.ParseIP(host); {
	case host == "localhost":
		host = "127.0.0.1"
	case host == "":
		return "", fmt.Errorf("%q has no host, which would mean every interface; use 127.0.0.1%s", addr, addr)
	case ip == nil || !ip.IsLoopback():
		return "", fmt.Errorf("host %q is not a loopback address; the development broker listens on 127.0.0.1 or localhost only", host)
	}
	return net.JoinHostPort(host, port), nil
}

// Start starts the broker and returns once it accepts connections.
func Start(cfg Config) (*Cluster, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	addr, err := ListenAddr(cfg.Addr)
	if err != nil {
		return nil, err
	}
	if cfg.Partitions < 0 {
		return nil, errors.New("partitions must not be negative")
	}
	opts := []kfake.Opt{
		// Ports makes one broker. Its port only reaches ListenFn in the
		// address, whose host is always kfake's 127.0.0.1, so ListenFn
		// listens on our own address instead.
		kfake.Ports(0),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, addr)
		}),
		kfake.AllowAutoTopicCreation(),
	}
	if cfg.Partitions > 0 {
		opts = append(opts, kfake.DefaultNumPartitions(cfg.Partitions))
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	kc, err := kfake.NewCluster(append(opts, cfg.Opts...)...)
	if err != nil {
		return nil, err
	}
	if cfg.DataDir != "" {
		persistAutoCreatedTopics(kc)
		journalTxnOffsets(kc, cfg.DataDir) // txnjournal.go
	}
	// NewCluster has bound the listener, so connections queue from here on
	// even before its accept loop runs.
	return &Cluster{Cluster: kc, addr: kc.ListenAddrs()[0]}, nil
}

// persistAutoCreatedTopics makes topics that metadata requests auto-create
// durable at once rather than only on Close (see the package documentation).
//
// kfake runs control functions one at a time on their own goroutine while
// its run loop keeps serving admin calls, so calling CreateTopic from one is
// safe, including while Close runs. The metadata request then finds the
// topic and kfake answers it as usual. kfake takes controls only once it
// runs, so a request in the instant between NewCluster and this call would
// still auto-create the old way; with port 0 no client knows the port yet.
func persistAutoCreatedTopics(kc *kfake.Cluster) {
	var (
		mu    sync.Mutex
		known = map[string]bool{} // topics we made sure exist; guarded by mu
	)
	kc.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.MetadataRequest)
		if !req.AllowAutoTopicCreation {
			return nil, nil, false
		}
		mu.Lock()
		defer mu.Unlock()
		for _, t := range req.Topics {
			if t.Topic == nil || known[*t.Topic] {
				continue
			}
			// Created, already there or an invalid name: in every case
			// there is nothing more for us to do for this name.
			_ = kc.CreateTopic(*t.Topic, 0, nil)
			known[*t.Topic] = true
		}
		return nil, nil, false
	})
	kc.ControlKey(int16(kmsg.DeleteTopics), func(kmsg.Request) (kmsg.Response, error, bool) {
		// A deleted topic may be auto-created again; forget everything
		// rather than map the request's topic IDs to names.
		mu.Lock()
		clear(known)
		mu.Unlock()
		return nil, nil, false
	})
}
