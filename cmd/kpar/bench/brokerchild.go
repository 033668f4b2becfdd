package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar/cmd/kpar/internal/embedded"
)

// A broker in a child process (Config.SpawnBroker). In process, the
// broker's records (150 MB for noop) and its multi-megabyte fetch
// responses live in the contenders' heap and go through their collector;
// a run then measures how the runtime's memory management falls on the
// fetch chain as much as the contender (BENCHMARKS.md, tenth pass). In a
// child, the contenders' process holds only what they fetched.
//
// The parent drives the child's gate over its stdin and stdout, one line
// each way per step:
//
//	child:  addr 127.0.0.1:PORT    once, when it accepts connections
//	parent: close                  hold every Fetch and ShareFetch from now on
//	child:  closed
//	child:  fetched                at the first held Fetch (share-fetched: ShareFetch)
//	parent: open                   answer them, and everything after
//	child:  opened
//
// The child exits when its stdin closes, so it never outlives the bench.

// brokerChild is the parent's side of a child broker.
type brokerChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu      sync.Mutex
	gate    *gate         // the gate the next fetched lines belong to
	replies chan string   // closed and opened, in order
	exited  chan struct{} // closed once the child's stdout ended
}

// startBrokerChild starts cmd (see Config.SpawnBroker) and waits for its
// address.
func startBrokerChild(cmd *exec.Cmd) (*brokerChild, string, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("starting the broker's child process: %w", err)
	}
	c := &brokerChild{cmd: cmd, stdin: stdin, replies: make(chan string, 4), exited: make(chan struct{})}
	addr := make(chan string, 1)
	go c.read(stdout, addr)
	select {
	case a := <-addr:
		return c, a, nil
	case <-c.exited:
	case <-time.After(30 * time.Second):
	}
	c.close()
	return nil, "", errors.New("the broker's child process did not report its address")
}

// read follows the child's stdout until it ends.
func (c *brokerChild) read(stdout io.Reader, addr chan<- string) {
	defer close(c.exited)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "addr "):
			addr <- strings.TrimPrefix(line, "addr ")
		case line == "fetched" || line == "share-fetched":
			c.mu.Lock()
			g := c.gate
			c.mu.Unlock()
			if g == nil {
				continue
			}
			if line == "fetched" {
				g.saw(int16(kmsg.Fetch))
			} else {
				g.saw(int16(kmsg.ShareFetch))
			}
		default:
			c.replies <- line
		}
	}
}

// send writes cmd to the child and waits for its reply.
func (c *brokerChild) send(cmd, reply string) error {
	if _, err := fmt.Fprintln(c.stdin, cmd); err != nil {
		return fmt.Errorf("broker child: %s: %w", cmd, err)
	}
	select {
	case got := <-c.replies:
		if got != reply {
			return fmt.Errorf("broker child: %s: got %q, want %q", cmd, got, reply)
		}
		return nil
	case <-c.exited:
		return fmt.Errorf("broker child: %s: the child exited", cmd)
	case <-time.After(30 * time.Second):
		return fmt.Errorf("broker child: %s: no reply", cmd)
	}
}

// closeGate holds fetches at the child broker until g opens.
func (c *brokerChild) closeGate(g *gate) error {
	c.mu.Lock()
	c.gate = g
	c.mu.Unlock()
	g.onOpen = func() error { return c.send("open", "opened") }
	return c.send("close", "closed")
}

// close ends the child: its stdin closes, and it is killed if it has not
// exited a few seconds later.
func (c *brokerChild) close() {
	c.stdin.Close()
	select {
	case <-c.exited:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
	}
	c.cmd.Wait()
}

// ServeBroker is the child side of Config.SpawnBroker: it runs a broker
// on 127.0.0.1, writes its address to out and follows the gate commands
// read from in (see above) until in ends.
func ServeBroker(ctx context.Context, in io.Reader, out io.Writer) error {
	kc, err := embedded.Start(embedded.Config{})
	if err != nil {
		return fmt.Errorf("broker child: %w", err)
	}
	defer kc.Close()
	var outMu sync.Mutex // lines from the gate's controls and the command loop
	say := func(line string) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintln(out, line)
	}
	say("addr " + kc.Addr())

	var open chan struct{} // the current gate; nil when none is closed
	seen := func(key int16) {
		if key == int16(kmsg.ShareFetch) {
			say("share-fetched")
		} else {
			say("fetched")
		}
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() && ctx.Err() == nil {
		switch sc.Text() {
		case "close":
			if open != nil {
				close(open)
			}
			open = make(chan struct{})
			holdFetches(kc, open, seen)
			say("closed")
		case "open":
			if open != nil {
				close(open)
				open = nil
			}
			say("opened")
		default:
			say("error: unknown command " + sc.Text())
		}
	}
	if open != nil {
		close(open)
	}
	return sc.Err()
}
