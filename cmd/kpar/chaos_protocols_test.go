package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kpar/kpar"
)

// The chaos tests run each scenario in both group protocols, with the
// group's timeouts set alike in each, and can keep their members' logs.

// inEachProtocol runs test in each group protocol, as parallel subtests
// named by the protocol ("classic", "consumer").
func inEachProtocol(t *testing.T, test func(t *testing.T, p kpar.Protocol)) {
	for _, p := range []kpar.Protocol{kpar.ClassicProtocol, kpar.ConsumerProtocol} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			test(t, p)
		})
	}
}

// consumerHeartbeat is the heartbeat interval the chaos tests give
// consumer-protocol groups (group.consumer.heartbeat.interval.ms; Kafka's
// default is 5 s, kpar broker's 1 s): members learn of a new assignment
// at their next heartbeat, and the session timeout must stay well above
// it.
const consumerHeartbeat = time.Second

// setGroupTimeouts gives group the session timeout sessionTimeout in
// protocol p. The classic protocol takes it from each member
// (--session-timeout, returned as arguments), the consumer protocol from
// the broker: a member's --session-timeout means nothing there, so this
// sets the group's consumer.session.timeout.ms and the broker's heartbeat
// interval (consumerHeartbeat) as an operator would (kafka-configs
// --entity-type groups / brokers). Kafka itself refuses a session timeout
// below group.consumer.min.session.timeout.ms (45 s by default); kpar
// broker (kfake) does not, so the tests need not wait 45 s per SIGKILL.
// On a real cluster that refuses, the consumer-protocol test is skipped.
func setGroupTimeouts(ctx context.Context, t *testing.T, addr, group string, p kpar.Protocol, sessionTimeout time.Duration) []string {
	t.Helper()
	args := []string{"--group-protocol", p.String()}
	if p == kpar.ClassicProtocol {
		return append(args, "--session-timeout", sessionTimeout.String())
	}
	cl := newClient(t, addr)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	hb := strconv.FormatInt(consumerHeartbeat.Milliseconds(), 10)
	resps, err := adm.AlterBrokerConfigs(ctx, []kadm.AlterConfig{{Name: "group.consumer.heartbeat.interval.ms", Value: &hb}})
	for _, r := range resps {
		if err == nil {
			err = r.Err
		}
	}
	if err == nil {
		err = setGroupConfig(ctx, cl.Request, group, "consumer.session.timeout.ms", strconv.FormatInt(sessionTimeout.Milliseconds(), 10))
	}
	if err != nil {
		skipOnRealCluster(t, fmt.Sprintf("setting the consumer protocol's heartbeat and session timeout: %v", err))
		t.Fatalf("setting the consumer protocol's heartbeat and session timeout: %v", err)
	}
	return args
}

// setGroupConfig sets one config of a group (IncrementalAlterConfigs on a
// GROUP resource, KIP-848's per-group configs), which kadm has no call for.
func setGroupConfig(ctx context.Context, request func(context.Context, kmsg.Request) (kmsg.Response, error), group, name, value string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Op, c.Value = name, kmsg.IncrementalAlterConfigOpSet, &value
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := request(ctx, req)
	if err != nil {
		return err
	}
	for _, r := range resp.(*kmsg.IncrementalAlterConfigsResponse).Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("group %s config %s=%s: %w", group, name, value, err)
		}
	}
	return nil
}

// chaosLogLevel is the members' --log-level: warn, or KPAR_CHAOS_LOG_LEVEL
// (debug shows franz-go's group and commit traffic).
func chaosLogLevel() string {
	if l := os.Getenv("KPAR_CHAOS_LOG_LEVEL"); l != "" {
		return l
	}
	return "warn"
}

// startMember is startForward for the chaos tests' group members: with
// KPAR_CHAOS_LOGS=DIR, each member's stderr is saved at the test's end to
// DIR/<test>.<n>.log, to read what a soak's members did.
func startMember(ctx context.Context, t *testing.T, bin string, args ...string) *process {
	t.Helper()
	p := startForward(ctx, t, bin, nil, args...)
	if dir := os.Getenv("KPAR_CHAOS_LOGS"); dir != "" {
		memberLogs.Lock()
		memberLogs.n[t.Name()]++
		name := fmt.Sprintf("%s.%d.log", strings.ReplaceAll(t.Name(), "/", "."), memberLogs.n[t.Name()])
		memberLogs.Unlock()
		t.Cleanup(func() { // before startForward's, which kills it the same way
			p.cmd.Process.Kill()
			<-p.exited
			if err := os.WriteFile(filepath.Join(dir, name), []byte(p.stderr.String()), 0o644); err != nil {
				t.Log(err)
			}
		})
	}
	return p
}

// memberLogs numbers each test's members for their log files.
var memberLogs = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}
