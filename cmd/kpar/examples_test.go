package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// exampleRecords is how many JSON records each example gets per mode; one
// more record, at exampleBad, is not JSON.
const (
	exampleRecords = 24
	exampleBad     = 10
)

// TestExampleEndpoints runs examples/python (Flask), examples/node
// (express) and examples/go end to end, as docs/http-contract.md tells a
// newcomer to: `kpar broker`, JSON records, `kpar forward --content-type
// application/json` one record per request and with --batch, then the
// endpoint, started last. Every JSON record must be processed on its
// first attempt (no "handler failed" but for the bad record), exactly
// once, and committed; the record that is not JSON must be dead-lettered
// with the endpoint's reason.
//
// A runtime that is missing (python3 with Flask, node with express
// installed by `npm ci`) skips its example, or fails it under CI, whose
// scripts/test.sh installs them.
func TestExampleEndpoints(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range []struct {
		name    string
		command func(t *testing.T) *exec.Cmd // the endpoint, or a skip
	}{
		{"python", func(t *testing.T) *exec.Cmd {
			py := pythonWithFlask()
			if py == "" {
				missing(t, "no python3 can import flask: apt-get install python3-flask")
			}
			cmd := exec.Command(py, "app.py")
			cmd.Dir = filepath.Join(root, "examples", "python")
			return cmd
		}},
		{"node", func(t *testing.T) *exec.Cmd {
			node, err := exec.LookPath("node")
			if err != nil {
				missing(t, "no node: apt-get install nodejs npm")
			}
			dir := filepath.Join(root, "examples", "node")
			if _, err := os.Stat(filepath.Join(dir, "node_modules", "express", "package.json")); err != nil {
				missing(t, "express is not installed: run npm ci in examples/node")
			}
			cmd := exec.Command(node, "app.js")
			cmd.Dir = dir
			return cmd
		}},
		{"go", func(t *testing.T) *exec.Cmd {
			bin := filepath.Join(t.TempDir(), "endpoint")
			build := exec.Command("go", "build", "-o", bin, "./examples/go")
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build ./examples/go: %v\n%s", err, out)
			}
			return exec.Command(bin)
		}},
	} {
		t.Run(ex.name, func(t *testing.T) {
			t.Parallel()
			endpoint := ex.command(t)
			bin, ctx := e2e(t, 3*time.Minute)
			testExampleEndpoint(ctx, t, bin, endpoint)
		})
	}
}

func testExampleEndpoint(ctx context.Context, t *testing.T, bin string, endpoint *exec.Cmd) {
	_, addr := startBrokerProcess(ctx, t, bin, "--listen", "127.0.0.1:0", "--partitions", "3")
	produceJSON(ctx, t, addr, "orders")
	produceJSON(ctx, t, addr, "orders-batch")
	port := freePort(t)
	url := "http://127.0.0.1:" + port

	// The forwarders start first: they wait for the endpoint.
	common := []string{"--brokers", addr, "--content-type", "application/json"}
	single := startForward(ctx, t, bin, nil, append(common, "--group", "example", "--topic", "orders", "--url", url+"/records")...)
	batch := startForward(ctx, t, bin, nil, append(common, "--group", "example-batch", "--topic", "orders-batch",
		"--url", url+"/batch", "--batch", "8")...)

	out, errOut := newWatchWriter(), newWatchWriter()
	endpoint.Env = append(os.Environ(), "PORT="+port)
	endpoint.Stdout, endpoint.Stderr = out, errOut
	endpoint.WaitDelay = 5 * time.Second
	if err := endpoint.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { endpoint.Wait(); close(exited) }()
	t.Cleanup(func() { endpoint.Process.Kill(); <-exited })

	processed := func() map[string]int { // id -> lines; called with out.mu held
		ids := map[string]int{}
		for line := range strings.SplitSeq(out.buf.String(), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "processed" {
				ids[f[1]]++
			}
		}
		return ids
	}
	if !out.await(ctx, exited, func() bool { return len(processed()) == 2*exampleRecords }) {
		t.Fatalf("the endpoint processed %d of %d records (exited: %v)\nstdout:\n%s\nstderr:\n%s\nkpar forward:\n%s\nkpar forward --batch:\n%s",
			len(processed()), 2*exampleRecords, endpoint.ProcessState, out, tail(errOut), tail(single.stderr), tail(batch.stderr))
	}

	for _, c := range []struct {
		topic, group, inBatch string
		p                     *process
	}{{"orders", "example", "", single}, {"orders-batch", "example-batch", " (in a batch of ", batch}} {
		letters := readAll(ctx, t, addr, c.topic+".dlq", 1)
		msg := headerValue(letters[0], deadletter.HeaderMessage)
		if string(letters[0].Value) != "not json" || !strings.Contains(msg, "the value is not JSON") || !strings.Contains(msg, c.inBatch) {
			t.Errorf("%s: dead letter %q with message %q, want the record that is not JSON and the endpoint's reason", c.topic, letters[0].Value, msg)
		}
		if code := c.p.stop(ctx, t, syscall.SIGTERM); code != 0 {
			t.Errorf("%s: kpar forward exited %d after SIGTERM; stderr:\n%s", c.topic, code, tail(c.p.stderr))
		}
		if n := strings.Count(c.p.stderr.String(), "kpar: handler failed"); n != 1 {
			t.Errorf("%s: %d failed attempts, want 1 (the record that is not JSON); stderr:\n%s", c.topic, n, tail(c.p.stderr))
		}
		checkCommittedAtEnd(ctx, t, addr, c.group, c.topic)
	}
	out.mu.Lock()
	ids := processed()
	out.mu.Unlock()
	for _, topic := range []string{"orders", "orders-batch"} {
		for _, r := range readAll(ctx, t, addr, topic, exampleRecords+1) {
			id := fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
			want := 1
			if string(r.Value) == "not json" {
				want = 0
			}
			if ids[id] != want {
				t.Errorf("record %s (%s) processed %d times, want %d", id, r.Value, ids[id], want)
			}
		}
	}
}

// produceJSON writes exampleRecords JSON records to topic, and the record
// "not json" at exampleBad.
func produceJSON(ctx context.Context, t *testing.T, addr, topic string) {
	t.Helper()
	cl := newClient(t, addr, kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic(topic))
	defer cl.Close()
	var rs []*kgo.Record
	for i := range exampleRecords + 1 {
		v := fmt.Sprintf(`{"order": %d, "sku": "A-%d", "note": "naïve café"}`, i, i%7)
		if i == exampleBad {
			v = "not json"
		}
		rs = append(rs, &kgo.Record{Key: []byte("customer-" + strconv.Itoa(i%5)), Value: []byte(v)})
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// pythonWithFlask is a python3 that can import flask (Debian's
// python3-flask, or one on PATH that has it), or "".
func pythonWithFlask() string {
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if path, err := exec.LookPath(py); err == nil && exec.Command(path, "-c", "import flask").Run() == nil {
			return path
		}
	}
	return ""
}

// missing skips an example whose runtime is not installed, or fails it
// under CI, where scripts/test.sh installs every runtime.
func missing(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (scripts/test.sh installs it)", why)
	}
	t.Skipf("%s (scripts/test.sh installs it)", why)
}

// freePort is a loopback port nothing listens on, for a program that
// takes its port from PORT.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
