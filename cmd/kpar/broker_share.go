package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// shareStateFile is the file in a --data-dir where kpar broker notes the
// share groups the broker served and whether it stopped cleanly since.
//
// kfake keeps a share group's progress (its start offset, which records
// were acknowledged, acquired or archived) and its configuration
// (share.auto.offset.reset) only in session_state.json, which it writes on
// a clean Close. After a kill -9 or a crash the share groups are gone: a
// member still running finds a new group that starts at the newest record
// and silently skips everything in between (measured: 680 of 3,000 records
// delivered, the rest never), and a restarted one reads everything again.
// kfake's own files say nothing of share groups after such a stop, so kpar
// broker keeps this note and refuses to start on a directory whose share
// groups it could not save.
const shareStateFile = "kpar-share-groups.json"

// shareState is shareStateFile's content.
type shareState struct {
	Groups []string `json:"share_groups"`
	// StoppedCleanly is true once the broker closed and kfake saved the
	// groups' progress; false while it runs.
	StoppedCleanly bool `json:"stopped_cleanly"`
}

// errShareStateLost is the refusal to start on a directory whose share
// groups lost their progress.
var errShareStateLost = errors.New("share-group progress lost")

// shareGuard keeps shareStateFile of one data directory up to date while
// the broker runs.
type shareGuard struct {
	path   string
	stderr io.Writer // for a note that cannot be written

	mu     sync.Mutex      // guards groups and the file's writes
	groups map[string]bool // the share groups noted in the file
}

// guardShareGroups reads dir's shareStateFile before kfake loads the
// directory. A broker that served share groups and did not stop cleanly
// is refused (errShareStateLost), unless forget: then the note is dropped
// and the groups start afresh. Otherwise the groups restored from a clean
// stop are noted as live again.
func guardShareGroups(dir string, forget bool, stderr io.Writer) (*shareGuard, error) {
	g := &shareGuard{path: filepath.Join(dir, shareStateFile), stderr: stderr, groups: map[string]bool{}}
	b, err := os.ReadFile(g.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return g, nil
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", g.path, err)
	}
	var st shareState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s is not kpar broker's note of share groups (%v); remove it if the directory holds no share group", g.path, err)
	}
	if !st.StoppedCleanly && len(st.Groups) > 0 && !forget {
		return nil, fmt.Errorf("%w: --data-dir %s held share groups (%s) and the broker that used it did not stop cleanly (kill -9 or a crash). "+
			"The broker saves a share group's progress (which records were acknowledged) only when it stops on SIGINT or SIGTERM, "+
			"so their members would now silently skip records, or get all of them again. "+
			"Start with --forget-share-groups to drop those groups (they start afresh: restart their members, and kpar forward --share-group reads every record again from the oldest), or use another --data-dir",
			errShareStateLost, dir, strings.Join(st.Groups, ", "))
	}
	if forget {
		if err := os.Remove(g.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return g, nil
	}
	for _, name := range st.Groups {
		g.groups[name] = true
	}
	// The groups kfake is about to restore are live again: a kill from
	// here on loses them.
	return g, g.write(false)
}

// watch notes every share group that heartbeats, before kfake handles the
// heartbeat. The note is written once per new group.
func (g *shareGuard) watch(kc *kfake.Cluster) {
	kc.ControlKey(int16(kmsg.ShareGroupHeartbeat), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		name := kreq.(*kmsg.ShareGroupHeartbeatRequest).GroupID
		g.mu.Lock()
		defer g.mu.Unlock()
		if name != "" && !g.groups[name] {
			g.groups[name] = true
			if err := g.writeLocked(false); err != nil {
				// The broker goes on; a later kill would then not be
				// caught, which the log says now.
				fmt.Fprintf(g.stderr, "kpar broker: cannot note share group %q in %s: %v\n", name, g.path, err)
			}
		}
		return nil, nil, false // kfake handles it
	})
}

// stopped notes that the broker closed cleanly: kfake saved the share
// groups' progress, and the next start may load it.
func (g *shareGuard) stopped() error { return g.write(true) }

func (g *shareGuard) write(clean bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.writeLocked(clean)
}

// writeLocked replaces the file atomically (a temporary file renamed over
// it). Without any share group there is nothing to note. Called with mu
// held.
func (g *shareGuard) writeLocked(clean bool) error {
	if len(g.groups) == 0 {
		return nil
	}
	st := shareState{StoppedCleanly: clean}
	for name := range g.groups {
		st.Groups = append(st.Groups, name)
	}
	slices.Sort(st.Groups)
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := g.path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, g.path)
}

// shareSessionFlags are kpar broker's share-group session flags. A member
// that stops without leaving (kill -9, a crash) keeps its share partitions
// assigned, and the records it acquired locked, until its share session
// expires: kfake reads group.share.session.timeout.ms (45s by default, as
// Kafka's) and group.share.heartbeat.interval.ms, whose 5s default would
// also delay a new member's first assignment.
type shareSessionFlags struct {
	session, heartbeat *time.Duration
}

func addShareSessionFlags(fs *flagSet) shareSessionFlags {
	return shareSessionFlags{
		session:   fs.Duration("share-session-timeout", 45*time.Second, "how long a share group keeps a silent member (kill -9, a crash): its partitions stay assigned to it and the records it acquired locked (up to --share-lock-duration) until then (group.share.session.timeout.ms; Kafka's default); kpar forward --share-group logs when it waits for one"),
		heartbeat: fs.Duration("share-heartbeat-interval", time.Second, "how often share-group members heartbeat, and so how soon they learn a new assignment (group.share.heartbeat.interval.ms; Kafka's default is 5s)"),
	}
}

// check returns the usage error of invalid values, or "".
func (f shareSessionFlags) check() string {
	switch {
	case *f.session < time.Second || *f.session > 30*time.Minute:
		return fmt.Sprintf("invalid --share-session-timeout %v: want 1s to 30m", *f.session)
	case *f.heartbeat < 100*time.Millisecond || *f.heartbeat >= *f.session:
		return fmt.Sprintf("invalid --share-heartbeat-interval %v: want 100ms or more, below --share-session-timeout (%v)", *f.heartbeat, *f.session)
	}
	return ""
}

// configs adds the broker configs of the flags to m.
func (f shareSessionFlags) configs(m map[string]string) map[string]string {
	m["group.share.session.timeout.ms"] = strconv.FormatInt(f.session.Milliseconds(), 10)
	m["group.share.heartbeat.interval.ms"] = strconv.FormatInt(f.heartbeat.Milliseconds(), 10)
	return m
}
